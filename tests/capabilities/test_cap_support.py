"""The support matrix: one table, written in the docs and enforced in code."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer_kernel.capabilities import (
    SUPPORT_MATRIX,
    matrix_markdown,
    simulated_capabilities,
    worker_support,
)
from gpulayer_kernel.capabilities.kinds import GIB
from gpulayer_kernel.capabilities.support import job_refusal
from gpulayer_kernel.contracts import Device, Frameworks, Reason, WorkerCapabilities

DOC = Path(__file__).resolve().parents[2] / "docs" / "support-matrix.md"


def caps(vendor: str, n: int = 1, **frameworks: object) -> WorkerCapabilities:
    return WorkerCapabilities(
        devices=[
            Device.model_validate({"index": i, "vendor": vendor, "name": "gpu", "kind": "x"})
            for i in range(n)
        ],
        frameworks=Frameworks.model_validate(frameworks),
    )


def test_the_docs_embed_the_matrix_the_code_enforces() -> None:
    assert matrix_markdown() in DOC.read_text()
    assert {row.vendor for row in SUPPORT_MATRIX} == {"nvidia", "amd", "apple", "cpu", "sim"}


def test_nvidia_is_usable_when_its_driver_is() -> None:
    s = worker_support(caps("nvidia", 2))  # no torch at all
    assert len(s.usable) == 2 and s.runtime == "cuda" and not s.single_device_only


def test_amd_needs_torch_rocm() -> None:
    plain = worker_support(caps("amd"))
    assert plain.usable == () and plain.runtime == "cpu"
    assert plain.unusable[0].reason is Reason.UNSUPPORTED_VENDOR
    assert plain.unusable[0].why == "AMD GPU without a working torch ROCm"
    rocm = worker_support(caps("amd", torch_hip="6.2", cuda_available=True))
    assert len(rocm.usable) == 1 and rocm.runtime == "rocm"


def test_apple_mps_single_device_only() -> None:
    s = worker_support(caps("apple", mps_available=True))
    assert s.runtime == "mps" and s.single_device_only and s.dist_backend is None
    assert job_refusal(s, gpus=1, nodes=1) is None
    refusal = job_refusal(s, gpus=2, nodes=1)
    assert refusal is not None and refusal[0] is Reason.MPS_DISTRIBUTED
    assert job_refusal(s, gpus=1, nodes=2) is not None
    assert worker_support(caps("apple")).usable == ()  # no torch MPS: reported, not usable


def test_cpu_entries_are_not_accelerators() -> None:
    s = worker_support(caps("cpu", 4))
    assert s.reported == 0 and s.runtime == "cpu"


def test_simulated_capabilities() -> None:
    c = simulated_capabilities(4, "a100-80gb")
    assert c.simulated and c.runtime == "sim" and c.dist_backend == "gloo"
    assert [d.index for d in c.devices] == [0, 1, 2, 3]
    d = c.devices[0]
    assert (d.vendor, d.kind, d.memory_bytes, d.name) == (
        "sim",
        "a100",
        80 * GIB,
        "Simulated A100 80 GB",
    )
    assert d.simulated
    assert c.probe_sources == ["simulated"]
    assert worker_support(c).simulated
    base = WorkerCapabilities(
        frameworks=Frameworks(torch_version="2.13.0"), probe_sources=["torch"]
    )
    merged = simulated_capabilities(2, "h100", base=base)
    assert merged.frameworks.torch_version == "2.13.0"  # frameworks stay what the probe found
    assert merged.devices[0].memory_bytes == 16 * GIB
    assert merged.probe_sources == ["torch", "simulated"]


def test_old_capabilities_json_still_parses() -> None:
    """Contracts only grow: a worker from before the new fields still validates."""
    old = (
        '{"api_version": "gpulayer/v1", "devices": [{"index": 0, "vendor": "nvidia", '
        '"name": "NVIDIA L4", "kind": "l4"}], "frameworks": {"torch_version": "2.4.0"}}'
    )
    c = WorkerCapabilities.model_validate_json(old)
    assert c.runtime == "cpu" and c.probe_sources == [] and c.frameworks.distributed_backends == []
    assert worker_support(c).runtime == "cuda"  # the scheduler reads the devices, not the field


def test_negative_simulated_count_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="simulated GPU count must be >= 0, got -1"):
        simulated_capabilities(-1)
