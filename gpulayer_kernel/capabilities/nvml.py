"""NVML through ctypes: the driver's own library, so a box without ``pynvml`` still reads its GPUs.

``libnvidia-ml.so.1`` ships with every NVIDIA driver; ``pynvml`` (nvidia-ml-py) is only a Python
wrapper around it and is often not installed. ``load()`` opens the library and returns an object
with the few calls ``readers.read_nvml`` makes, under pynvml's names, so either one feeds the same
reader. Only the versioned entry points that exist since driver 325 are used (``_v2`` where NVML
has one), and every call's status is checked: a failure raises ``NvmlError`` with NVML's own
words ("Driver/library version mismatch"), which the reader turns into a ``probe_errors`` line.

Tests pass ``lib``: an object with the same C functions (see ``tests/capabilities``), since no
machine here has the library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from typing import Any

# Buffer sizes NVML documents (nvml.h: NVML_DEVICE_NAME_V2_BUFFER_SIZE and friends).
NAME_BUFFER = 96
UUID_BUFFER = 96
VERSION_BUFFER = 80
NVML_SUCCESS = 0


class NvmlError(RuntimeError):
    """An NVML call returned a status other than success."""


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def library_names() -> Iterator[str]:
    """Where the driver's NVML lives, in the order tried (``find_library`` runs ``ldconfig``,
    so only when the usual name is not found)."""
    if sys.platform == "win32":
        yield "nvml.dll"
        return
    yield "libnvidia-ml.so.1"
    found = ctypes.util.find_library("nvidia-ml")
    if found:
        yield found


def load(lib: Any = None) -> CtypesNvml:
    """The driver's NVML (or ``lib``, an object with its C functions); raises ``OSError`` when
    no NVIDIA driver library is installed."""
    if lib is None:
        errors: list[str] = []
        for name in library_names():
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                errors.append(str(exc))
        else:
            raise OSError(f"no NVIDIA driver library ({'; '.join(errors) or 'not found'})")
    return CtypesNvml(lib)


class CtypesNvml:
    """pynvml's calls that ``read_nvml`` makes, on the C library."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def _check(self, status: int) -> None:
        if status != NVML_SUCCESS:
            try:
                text = self.lib.nvmlErrorString(status)
                why = text.decode() if isinstance(text, bytes) else str(text)
            except Exception:  # an old library, or a fake without it
                why = ""
            raise NvmlError(f"NVML error {status}" + (f": {why}" if why else ""))

    def _text(self, fn: Any, *args: Any, size: int) -> str:
        buf = ctypes.create_string_buffer(size)
        self._check(fn(*args, buf, ctypes.c_uint(size)))
        return buf.value.decode(errors="replace")

    def nvmlInit(self) -> None:
        self._check(self.lib.nvmlInit_v2())

    def nvmlShutdown(self) -> None:
        self._check(self.lib.nvmlShutdown())

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._text(self.lib.nvmlSystemGetDriverVersion, size=VERSION_BUFFER)

    def nvmlDeviceGetCount(self) -> int:
        count = ctypes.c_uint(0)
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)))
        return int(count.value)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._check(
            self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        )
        return handle

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:
        return self._text(self.lib.nvmlDeviceGetName, handle, size=NAME_BUFFER)

    def nvmlDeviceGetUUID(self, handle: ctypes.c_void_p) -> str:
        return self._text(self.lib.nvmlDeviceGetUUID, handle, size=UUID_BUFFER)

    def nvmlDeviceGetMemoryInfo(self, handle: ctypes.c_void_p) -> _Memory:
        memory = _Memory()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)))
        return memory

    def nvmlDeviceGetCudaComputeCapability(self, handle: ctypes.c_void_p) -> tuple[int, int]:
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._check(
            self.lib.nvmlDeviceGetCudaComputeCapability(
                handle, ctypes.byref(major), ctypes.byref(minor)
            )
        )
        return int(major.value), int(minor.value)
