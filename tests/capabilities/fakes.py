"""Fake torch and NVML modules with just the surface the probe reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

GIB = 1 << 30


def fake_torch(
    devices: Sequence[tuple[str, int, int, int]] = (),
    *,
    version: str = "2.13.0+cu124",
    cuda: str | None = "12.4",
    hip: str | None = None,
    mps: bool = False,
    cuda_error: Exception | None = None,
    backends: Sequence[str] = ("gloo", "nccl"),
) -> Any:
    """``devices``: (name, memory bytes, major, minor) as torch.cuda reports them."""
    props = [
        SimpleNamespace(
            name=name,
            total_memory=memory,
            major=major,
            minor=minor,
            uuid=f"5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d0{i}",
            gcnArchName="gfx942",
        )
        for i, (name, memory, major, minor) in enumerate(devices)
    ]

    def is_available() -> bool:
        if cuda_error is not None:
            raise cuda_error
        return bool(props)

    def check(name: str) -> Callable[[], bool]:
        return lambda: name in backends

    return SimpleNamespace(
        __version__=version,
        version=SimpleNamespace(cuda=cuda, hip=hip),
        cuda=SimpleNamespace(
            is_available=is_available,
            device_count=lambda: len(props),
            get_device_properties=lambda i: props[i],
        ),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
        distributed=SimpleNamespace(
            is_available=lambda: True,
            is_gloo_available=check("gloo"),
            is_nccl_available=check("nccl"),
            is_mpi_available=check("mpi"),
        ),
    )


def fake_nvml(
    devices: Sequence[tuple[str, int, tuple[int, int]]] = (),
    *,
    driver: bytes | str = b"550.54.15",
    init_error: Exception | None = None,
) -> Any:
    """``devices``: (name, memory bytes, (major, minor)); names as bytes, like old pynvml."""
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise init_error

    return SimpleNamespace(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: devices[h][0].encode(),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=devices[h][1]),
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd",
        nvmlDeviceGetCudaComputeCapability=lambda h: devices[h][2],
    )
