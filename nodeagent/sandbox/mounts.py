"""The node's table of image mounts and unpacked layers: one per digest, counted by the
sandboxes that use it, released after a grace period (`MountTable`, a mixin of
`nodeagent.sandbox.runtime.SandboxRuntime`, whose holder does the mounting).

The mixin uses the runtime's `_lock`, `_images`, `_partitions`, `_call`, `clock`,
`image_grace_s` and `overlay`. Must not import: zmq, controller, nodeagent.agent,
nodeagent.harness, nodeagent.verifier, nodeagent.sandbox.runtime.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from nodeagent.sandbox.host import image_partition
from nodeagent.sandbox.spec import SandboxError, SandboxSpec

log = logging.getLogger(__name__)

MAX_LAYERS = 16             # per sandbox (native/sbxinit.c MAX_LAYERS)
LAYER_KEY_PREFIX = "L"      # a layer's key (image keys are hex digits)


class ImageMount:
    """One image mounted by the node holder, counted by the sandboxes that use it."""

    def __init__(self, path: str):
        self.path, self.refs, self.idle_since = path, 0, None


class MountTable:
    """Images mounted and layers unpacked by the node holder, with their reference counts."""

    # -- images: one mount per digest, counted, unmounted after a grace period ---------------
    def mount_image(self, image: Path) -> str:
        """Mount `image` (once) and take a reference on it; the sandbox's destroy gives it back."""
        return self._mount(image, "image")

    def mount_layer(self, layer: Path) -> str:
        """Unpack `layer` (a squashfs of `layers.treelayer`) on the node (once) and take a
        reference on it; the sandbox's destroy gives it back. Its key starts with "L"."""
        return self._mount(layer, "layer")

    def _mount(self, image: Path, kind: str) -> str:
        try:
            st = os.stat(image)
        except FileNotFoundError:
            how = "`layers.treelayer.ensure_tree_layer`" if kind == "layer" else "`paddock image build`"
            raise SandboxError(f"{kind} {image} does not exist: build it with {how} "
                               f"or give the path of a file in the image store") from None
        ident = (str(image), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._partitions.get(ident)   # the same file, unchanged: no need to re-read it
        if cached is None:
            image = Path(image).resolve()
            try:
                cached = (*image_partition(image), str(image))
            except SandboxError:
                raise
            except Exception as exc:   # layers.sif.SifError: corrupt, truncated, another architecture
                raise SandboxError(f"{kind} {image} cannot be used: {exc}") from exc
            self._partitions[ident] = cached
        key, offset, image = cached
        if kind == "layer":
            key = LAYER_KEY_PREFIX + key
        with self._lock:
            m = self._images.get(key)
            if m is not None:
                m.refs += 1
                m.idle_since = None
                return key
        if kind == "layer":
            self._call({"op": "mount_layer", "key": key, "path": str(image), "offset": offset})
        else:
            self._call({"op": "mount_image", "key": key, "path": str(image), "offset": offset,
                        "extract": self.overlay == "extracted"})
        with self._lock:
            m = self._images.setdefault(key, ImageMount(str(image)))
            m.refs += 1
            m.idle_since = None
        return key

    def reap_images(self) -> list[str]:
        """Unmount images unused for longer than the grace period. Returns their keys."""
        now, gone = self.clock(), []
        with self._lock:
            idle = [k for k, m in self._images.items()
                    if m.refs == 0 and m.idle_since is not None and now - m.idle_since >= self.image_grace_s]
            for k in idle:
                del self._images[k]
        for k in idle:
            try:
                self._call({"op": "unmount_layer" if k.startswith(LAYER_KEY_PREFIX) else "unmount_image", "key": k})
                gone.append(k)
            except SandboxError as exc:
                log.warning("unmounting image %s failed: %s", k, exc)
        return gone

    def image_refs(self) -> dict[str, int]:
        with self._lock:
            return {k: m.refs for k, m in self._images.items()}

    def mounted_images(self) -> list[str]:
        return sorted(self._call({"op": "ping"})["images"])

    def mounted_layers(self) -> list[str]:
        """Keys of the layers unpacked on the node now (in use or within their grace period)."""
        return sorted(self._call({"op": "ping"})["layers"])

    def _mount_layers(self, spec: SandboxSpec) -> list[str]:
        """A reference on each of `spec.layers` (bottom first); all or none."""
        layers = tuple(getattr(spec, "layers", ()) or ())
        if len(layers) > MAX_LAYERS:
            raise SandboxError(f"a sandbox takes at most {MAX_LAYERS} layers, not {len(layers)}")
        keys: list[str] = []
        try:
            for layer in layers:
                keys.append(self.mount_layer(Path(layer)))
        except SandboxError:
            with self._lock:
                for k in keys:
                    self._unref_image_locked(k)
            raise
        return keys

    def _unref_image_locked(self, key: str) -> None:
        m = self._images.get(key)
        if m is not None:
            m.refs -= 1
            if m.refs <= 0:
                m.refs, m.idle_since = 0, self.clock()
