"""Triton's system shared-memory extension: named regions of POSIX shared memory objects.

A client creates ``/dev/shm/<key>``, registers ``[offset, offset + byte_size)`` of it under a name,
then names the region (and an offset and size inside it) for an input to read from or an output
to be written to, so tensors never travel through the socket.

Each region is a plain ``mmap`` of the object (``multiprocessing.shared_memory`` is avoided: its
resource tracker would unlink segments the server did not create). The registry is used on the
event loop only; an in-flight request holds views of the mapping (its input arrays, its output
targets), so unregistering a region that a request still uses only drops the name: the mapping
itself lives until the last view is gone (``mmap.close`` refuses while views exist; Python then
unmaps it when the request releases them). A request therefore never reads or writes unmapped
memory, and a region can be unregistered at any time.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from inferd.core.errors import InvalidRequest, NotFound

SHM_DIR = "/dev/shm"


class Region:
    """One registered region: the mapping of ``key`` from 0 to ``offset + byte_size``."""

    __slots__ = ("name", "key", "offset", "byte_size", "_map", "view")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map = mapping
        #: the registered bytes, writable
        self.view = memoryview(mapping)[offset : offset + byte_size]

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def slice(self, offset: int, byte_size: int) -> memoryview:
        """``byte_size`` bytes at ``offset`` inside the region (checked; a view, no copy)."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidRequest(
                f"Invalid offset + byte size for shared memory region: '{self.name}' (offset {offset} + byte size "
                f"{byte_size} is past the region's {self.byte_size} bytes)"
            )
        return self.view[offset : offset + byte_size]

    def close(self) -> None:
        """Unmap now if no request holds a view; otherwise when the last view is released."""
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            pass  # views still exported to in-flight requests: unmapped once they are dropped


class SharedMemoryRegistry:
    """The registered system shared memory regions, by name."""

    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if type(name) is not str or not name:
            raise InvalidRequest("a shared memory region needs a non-empty name")
        if type(key) is not str or not key:
            raise InvalidRequest(f"shared memory region '{name}' needs a non-empty 'key'")
        for label, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidRequest(f"shared memory region '{name}': '{label}' must be a non-negative integer")
        if name in self.regions:
            raise InvalidRequest(f"shared memory region '{name}' is already registered (unregister it first)")
        # As shm_open: leading slashes are dropped; no other slash is allowed.
        leaf = key.lstrip("/")
        if not leaf or "/" in leaf or leaf in (".", ".."):
            raise InvalidRequest(f"Unable to open shared memory region: '{key}' (not a valid shared memory key)")
        try:
            # O_NOFOLLOW: a symbolic link in /dev/shm must not map some other file into the server.
            fd = os.open(os.path.join(SHM_DIR, leaf), os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise InvalidRequest(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            end = offset + byte_size
            if end > size:
                raise InvalidRequest(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is past the end of "
                    f"'{key}' ({size} bytes)"
                )
            if end == 0:
                raise InvalidRequest(f"shared memory region '{name}': byte_size must be positive")
            try:
                mapping = mmap.mmap(fd, end, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as exc:
                raise InvalidRequest(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
        finally:
            os.close(fd)
        self.regions[name] = Region(name, key, offset, byte_size, mapping)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name:
            region = self.regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [region.status() for region in self.regions.values()]

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region (``None``). An unknown name is not an error (as Triton):
        unregistering is idempotent, so a client can always clean up."""
        if name:
            region = self.regions.pop(name, None)
            if region is not None:
                region.close()
            return
        regions = list(self.regions.values())
        self.regions.clear()
        for region in regions:
            region.close()

    def get(self, name: str) -> Region:
        region = self.regions.get(name)
        if region is None:
            raise InvalidRequest(f"Unable to find shared memory region: '{name}' (register it first)")
        return region

    def close(self) -> None:
        self.unregister(None)
