"""The native sandbox runtime's configuration object: one default per knob, checked when made
(errors name the key), single knobs replacing fields of a given config."""
from __future__ import annotations

import pytest

from nodeagent.sandbox.config import RuntimeConfig, RuntimeConfigError
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime


@pytest.mark.parametrize("knob, value, says", [
    ("slice_size", 0, "runtime.slice_size must be an integer >= 1, got 0"),
    ("layer_cache_mb", 1.5, "runtime.layer_cache_mb must be an integer >= 1"),
    ("image_grace_s", -1, "runtime.image_grace_s must be a number >= 0"),
    ("overlay", "zfs", "runtime.overlay must be one of"),
    ("caps", ("memory", "gpu"), "runtime.caps must name caps of"),
    ("subids", (100000,), "runtime.subids must be (base, count)"),
    ("degrade", "yes", "runtime.degrade must be true or false"),
    ("run_root", 5, "runtime.run_root must be a path or None"),
])
def test_an_invalid_runtime_knob_is_refused_naming_its_key(knob, value, says):
    with pytest.raises(RuntimeConfigError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
        RuntimeConfig(**{knob: value})


def test_a_config_error_is_both_a_sandbox_error_and_a_value_error():
    """Callers that catch SandboxError (a runtime that cannot start) or ValueError (bad input) see it."""
    assert issubclass(RuntimeConfigError, SandboxError) and issubclass(RuntimeConfigError, ValueError)


def test_the_runtime_takes_its_config_and_single_knobs_over_it():
    rt = SandboxRuntime(RuntimeConfig(degrade=True, image_grace_s=5.0), image_grace_s=7.0, clock=lambda: 0.0)
    assert rt.degrade and rt.image_grace_s == 7.0 and rt.config.image_grace_s == 7.0
    assert rt.caps == RuntimeConfig().caps and rt.slice_size == RuntimeConfig().slice_size


def test_an_unknown_runtime_knob_is_refused_listing_the_valid_ones():
    with pytest.raises(RuntimeConfigError, match=r"unknown sandbox runtime setting\(s\) \['grace_s'\]; valid: .*"
                                                 r"'image_grace_s'"):
        SandboxRuntime(grace_s=1.0)
