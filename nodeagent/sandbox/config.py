"""The native sandbox runtime's one configuration object: `RuntimeConfig`, every knob of
`SandboxRuntime` (nodeagent/sandbox/runtime.py) with its one default.

Frozen and validated when made: an invalid value raises `RuntimeConfigError` (both a
`SandboxError`, what a runtime that cannot start raises, and a `ValueError`) naming the key
(`runtime.slice_size must be an integer >= 1, got 0`). Where a knob's default depends on the
host (`subids`: the user's subordinate range; `run_root`; `state_dir`), None means "found at
start". `SandboxRuntime(config=...)` takes it; keyword knobs replace single fields
(`with_knobs`). The node agent's `serve` builds one from `paddock agent`'s flags.

Must not import: zmq, controller, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from nodeagent.sandbox.cgroups import CAPS
from nodeagent.sandbox.host import OVERLAY_MODES
from nodeagent.sandbox.spec import SandboxError

DEFAULT_SLICE_SIZE = 1024


class RuntimeConfigError(SandboxError, ValueError):
    """A runtime knob is invalid; the message names it."""


@dataclass(frozen=True)
class RuntimeConfig:
    state_dir: Optional[str] = None  # the node's state directory (None: a fresh one under run_root)
    subids: Optional[tuple[int, int]] = None  # (base, count) of the sandboxes' ids (None: the user's range)
    slice_size: int = DEFAULT_SLICE_SIZE  # subordinate ids per sandbox
    user: Optional[str] = None  # whose subordinate range (None: the caller's)
    caps: tuple[str, ...] = CAPS  # the caps every sandbox must get
    degrade: bool = False  # start even where a cap cannot be enforced (logged, in caps_report)
    use_cgroups: bool = True  # enforce caps by cgroups where the host lets us
    overlay: str = "auto"  # the writable root: one of OVERLAY_MODES
    image_grace_s: float = 60.0  # an unused image (or layer) stays mounted this long
    run_root: Optional[str] = None  # the per-user directory of state dirs (None: the default)
    user_space_caps: bool = True  # without cgroups, hold caps from user space
    layer_cache_mb: int = 4096  # the cap of the node's layer tmpfs

    def __post_init__(self) -> None:
        for key in ("slice_size", "layer_cache_mb"):
            _check_int(key, getattr(self, key), low=1)
        grace = self.image_grace_s
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise RuntimeConfigError(f"runtime.image_grace_s must be a number >= 0, got {grace!r}")
        if self.overlay not in OVERLAY_MODES:
            raise RuntimeConfigError(f"runtime.overlay must be one of {list(OVERLAY_MODES)}, got {self.overlay!r}")
        caps = tuple(self.caps)
        if any(c not in CAPS for c in caps):
            raise RuntimeConfigError(f"runtime.caps must name caps of {list(CAPS)}, got {self.caps!r}")
        object.__setattr__(self, "caps", caps)
        if self.subids is not None:
            ok = (isinstance(self.subids, (tuple, list)) and len(self.subids) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in self.subids))
            if not ok:
                raise RuntimeConfigError(f"runtime.subids must be (base, count), whole numbers >= 0, "
                                         f"got {self.subids!r}")
            object.__setattr__(self, "subids", (self.subids[0], self.subids[1]))
        for key in ("degrade", "use_cgroups", "user_space_caps"):
            if not isinstance(getattr(self, key), bool):
                raise RuntimeConfigError(f"runtime.{key} must be true or false, got {getattr(self, key)!r}")
        for key in ("state_dir", "user", "run_root"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise RuntimeConfigError(f"runtime.{key} must be a path or None, got {value!r}")


RUNTIME_KEYS = frozenset(f.name for f in dataclasses.fields(RuntimeConfig))


def with_knobs(config: RuntimeConfig, knobs: Mapping[str, Any]) -> RuntimeConfig:
    """`config` with some knobs replaced (validated again); an unknown key is a
    RuntimeConfigError naming it and the valid ones."""
    if not knobs:
        return config
    unknown = sorted(set(knobs) - RUNTIME_KEYS)
    if unknown:
        raise RuntimeConfigError(f"unknown sandbox runtime setting(s) {unknown}; valid: {sorted(RUNTIME_KEYS)}")
    return dataclasses.replace(config, **knobs)


def _check_int(key: str, value: Any, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RuntimeConfigError(f"runtime.{key} must be an integer >= {low}, got {value!r}")
