"""NVML through ctypes, against a stand-in for the driver's library (no GPU on this machine)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from gpulayer_kernel.capabilities.nvml import CtypesNvml, NvmlError, load
from gpulayer_kernel.capabilities.readers import probe, read_nvml
from gpulayer_kernel.contracts import HostFacts

GIB = 1 << 30
UNINITIALIZED, DRIVER_NOT_LOADED, NOT_SUPPORTED = 1, 9, 3
MESSAGES = {
    UNINITIALIZED: b"Uninitialized",
    DRIVER_NOT_LOADED: b"Driver Not Loaded",
    NOT_SUPPORTED: b"Not Supported",
}


class FakeLibNvml:
    """libnvidia-ml.so.1's C functions as ctypes calls them: status codes, out-parameters."""

    def __init__(
        self,
        devices: list[tuple[bytes, int, tuple[int, int] | None]],
        *,
        init_status: int = 0,
        driver: bytes = b"550.54.15",
    ) -> None:
        self.devices = devices
        self.init_status = init_status
        self.driver = driver
        self.calls: list[str] = []
        self.initialised = False

    @staticmethod
    def _out(arg: Any) -> Any:
        return arg._obj  # what ctypes.byref() points at

    def nvmlErrorString(self, status: int) -> bytes:
        return MESSAGES.get(status, b"Unknown Error")

    def nvmlInit_v2(self) -> int:
        self.calls.append("init")
        self.initialised = self.init_status == 0
        return self.init_status

    def nvmlShutdown(self) -> int:
        self.calls.append("shutdown")
        return 0 if self.initialised else UNINITIALIZED

    def nvmlSystemGetDriverVersion(self, buf: Any, size: ctypes.c_uint) -> int:
        buf.value = self.driver[: size.value - 1]
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        self._out(count).value = len(self.devices)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, handle: Any) -> int:
        self._out(handle).value = 0x1000 + index.value
        return 0

    def _device(self, handle: ctypes.c_void_p) -> tuple[bytes, int, tuple[int, int] | None]:
        assert handle.value is not None
        return self.devices[handle.value - 0x1000]

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p, buf: Any, size: ctypes.c_uint) -> int:
        buf.value = self._device(handle)[0]
        return 0

    def nvmlDeviceGetUUID(self, handle: ctypes.c_void_p, buf: Any, size: ctypes.c_uint) -> int:
        assert handle.value is not None
        buf.value = b"GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d0%d" % (handle.value - 0x1000)
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: ctypes.c_void_p, memory: Any) -> int:
        self._out(memory).total = self._device(handle)[1]
        return 0

    def nvmlDeviceGetCudaComputeCapability(
        self, handle: ctypes.c_void_p, major: Any, minor: Any
    ) -> int:
        cc = self._device(handle)[2]
        if cc is None:
            return NOT_SUPPORTED  # an old driver
        self._out(major).value, self._out(minor).value = cc
        return 0


H100 = (b"NVIDIA H100 80GB HBM3", 80 * GIB, (9, 0))


def test_read_nvml_through_ctypes() -> None:
    lib = FakeLibNvml([H100, H100, (b"Tesla T4", 15 * GIB, None)])
    found = read_nvml(load(lib))
    assert found.errors == [] and found.driver == "550.54.15"
    assert [(d.index, d.kind, d.memory_bytes, d.compute_capability) for d in found.devices] == [
        (0, "h100", 80 * GIB, "9.0"),
        (1, "h100", 80 * GIB, "9.0"),
        (2, "t4", 15 * GIB, None),
    ]
    assert found.devices[1].uuid == "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d01"
    assert lib.calls == ["init", "shutdown"]


def test_nvml_failures_carry_nvml_s_words() -> None:
    nvml = load(FakeLibNvml([H100], init_status=DRIVER_NOT_LOADED))
    with pytest.raises(NvmlError, match="NVML error 9: Driver Not Loaded"):
        nvml.nvmlInit()
    found = read_nvml(nvml)
    assert found.devices == []
    assert found.errors == ["nvml: NvmlError: NVML error 9: Driver Not Loaded"]


def test_the_probe_uses_ctypes_nvml_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pynvml and the driver's library loads: NVML is the source, nvidia-smi never runs."""
    import gpulayer_kernel.capabilities.nvml as nvml_module
    import gpulayer_kernel.capabilities.readers as readers

    lib = FakeLibNvml([H100])
    monkeypatch.setattr(readers, "import_optional", lambda name: (None, "not installed"))
    monkeypatch.setattr(nvml_module, "load", lambda: CtypesNvml(lib))

    def no_smi(argv: object, timeout: float) -> readers.SmiResult:
        raise AssertionError("nvidia-smi should not run")

    caps = probe(torch=None, smi=no_smi, env={}, host=HostFacts())
    assert caps.probe_sources == ["nvml"] and caps.runtime == "cuda", caps.probe_errors
    assert [d.name for d in caps.devices] == ["NVIDIA H100 80GB HBM3"]
    assert caps.probe_errors == []
    # The library missing too: both reasons, then nvidia-smi.
    monkeypatch.setattr(nvml_module, "load", _no_library)
    caps = probe(
        torch=None,
        smi=lambda argv, timeout: readers.SmiResult(error="not found on PATH"),
        env={},
        host=HostFacts(),
    )
    assert caps.devices == []
    assert caps.probe_errors == [
        "nvml: pynvml not installed, and no NVIDIA driver library (gone)",
        "nvidia-smi: not found on PATH",
    ]


def _no_library() -> Any:
    raise OSError("no NVIDIA driver library (gone)")


def test_no_driver_library_is_a_clear_oserror(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    with pytest.raises(OSError, match="no NVIDIA driver library.*libnvidia-ml.so.1"):
        load()
