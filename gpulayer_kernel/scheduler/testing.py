"""Builders for scheduler snapshots, shipped with the package so every test suite can use them.

    snap = snapshot(
        workers=[gpu_worker("w1", gpus=4, kind="h100"), cpu_worker("c1")],
        jobs=[job("3f2a9c1d", seq=1, gpus=2)],
    )
    plan = schedule(snap)

Capabilities are cached per argument tuple, so workers built with the same arguments share one
``WorkerCapabilities`` object, as the ControlPlane's do between passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Literal

from ..contracts import (
    ADMIN_USER,
    Device,
    Frameworks,
    HostFacts,
    Resources,
    WorkerCapabilities,
    WorkerState,
)
from .model import JobRequest, Reservation, RunningJob, Snapshot, WorkerView

GIB = 1 << 30
GpuVendor = Literal["nvidia", "amd", "apple", "sim"]


@lru_cache(maxsize=1024)
def capabilities(
    gpus: int = 0,
    kind: str = "h100",
    memory_gib: float = 80,
    *,
    vendor: GpuVendor = "nvidia",
    cpus: int = 32,
    rocm: bool = False,
    mps: bool = True,
) -> WorkerCapabilities:
    """Capabilities with ``gpus`` identical devices (``vendor="sim"``: simulated ones)."""
    devices = [
        Device(
            index=i,
            vendor=vendor,
            name=f"{vendor} {kind}",
            kind=kind,
            memory_bytes=int(memory_gib * GIB),
            unified_memory=vendor == "apple",
        )
        for i in range(gpus)
    ]
    frameworks = Frameworks(
        torch_version="2.13.0",
        torch_hip="6.2" if rocm else None,
        cuda_available=vendor in ("nvidia", "sim") or rocm,
        mps_available=vendor == "apple" and mps,
        device_count=gpus,
    )
    return WorkerCapabilities(
        host=HostFacts(hostname="host", cpus=cpus, memory_bytes=256 * GIB),
        devices=devices,
        frameworks=frameworks,
        simulated=vendor == "sim" and gpus > 0,
    )


def gpu_worker(
    id: str,
    gpus: int = 8,
    kind: str = "h100",
    *,
    memory_gib: float = 80,
    vendor: GpuVendor = "nvidia",
    cpus: int = 32,
    state: WorkerState = WorkerState.READY,
    labels: Mapping[str, str] | None = None,
    running: Sequence[RunningJob] = (),
    name: str | None = None,
    rocm: bool = False,
    mps: bool = True,
) -> WorkerView:
    """A worker with ``gpus`` devices of one kind."""
    caps = capabilities(gpus, kind, memory_gib, vendor=vendor, cpus=cpus, rocm=rocm, mps=mps)
    return WorkerView(
        id=id,
        name=name or id,
        state=state,
        labels=dict(labels or {}),
        capabilities=caps,
        running=tuple(running),
    )


def cpu_worker(
    id: str,
    *,
    cpus: int = 8,
    state: WorkerState = WorkerState.READY,
    labels: Mapping[str, str] | None = None,
    running: Sequence[RunningJob] = (),
    name: str | None = None,
) -> WorkerView:
    """A worker without accelerators."""
    return gpu_worker(id, 0, cpus=cpus, state=state, labels=labels, running=running, name=name)


def running(
    id: str,
    devices: Iterable[int] = (),
    *,
    cpus: float = 0.0,
    ends_by: float | None = None,
    owner: str = ADMIN_USER,
) -> RunningJob:
    return RunningJob(id=id, devices=tuple(devices), cpus=cpus, ends_by=ends_by, owner=owner)


def job(
    id: str,
    seq: int = 0,
    gpus: int = 0,
    *,
    nodes: int = 1,
    kind: str | Sequence[str] | None = None,
    memory_gib: float | None = None,
    cpus: float | None = None,
    fallback: bool = False,
    selector: Mapping[str, str] | None = None,
    worker: str | None = None,
    priority: int = 0,
    submitted_at: float = 1000.0,  # the default snapshot time: a fresh job
    timeout: float | None = None,
    owner: str = ADMIN_USER,
) -> JobRequest:
    """A queued job; ``kind`` is one kind or a preference list."""
    kinds = [kind] if isinstance(kind, str) else list(kind or [])
    resources = Resources(
        gpus=gpus,
        gpu_kind=kinds,
        gpu_memory_min=None if memory_gib is None else int(memory_gib * GIB),
        cpus=cpus,
        nodes=nodes,
        fallback=["cpu"] if fallback else [],
        selector=dict(selector or {}),
        worker=worker,
    )
    return JobRequest(
        id=id,
        seq=seq,
        priority=priority,
        resources=resources,
        submitted_at=submitted_at,
        timeout=timeout,
        owner=owner,
    )


def snapshot(
    workers: Sequence[WorkerView] = (),
    jobs: Sequence[JobRequest] = (),
    *,
    now: float = 1000.0,
    reservations: Mapping[str, Reservation] | None = None,
    reserve_after: float = 60.0,
    max_reservations: int = 16,
    usage: Mapping[str, float] | None = None,
    gpu_quotas: Mapping[str, int] | None = None,
    groups: Mapping[str, str] | None = None,
) -> Snapshot:
    return Snapshot(
        usage=dict(usage or {}),
        gpu_quotas=dict(gpu_quotas or {}),
        groups=dict(groups or {}),
        now=now,
        pending=tuple(jobs),
        workers=tuple(workers),
        reservations=dict(reservations or {}),
        reserve_after=reserve_after,
        max_reservations=max_reservations,
    )
