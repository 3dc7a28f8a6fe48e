"""Kind names: device names and what people type become the same short words."""

from __future__ import annotations

import pytest

from gpulayer_kernel.capabilities import normalize_kind, parse_kind
from gpulayer_kernel.capabilities.kinds import GIB, format_bytes


@pytest.mark.parametrize(
    ("name", "vendor", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", "nvidia", "h100"),
        ("NVIDIA H100 PCIe", "nvidia", "h100"),
        ("NVIDIA H200", "nvidia", "h200"),
        ("NVIDIA GH200 480GB", "nvidia", "gh200"),
        ("NVIDIA A100-SXM4-80GB", "nvidia", "a100"),
        ("NVIDIA A100-PCIE-40GB", "nvidia", "a100"),
        ("NVIDIA A10G", "nvidia", "a10g"),
        ("NVIDIA L4", "nvidia", "l4"),
        ("NVIDIA L40S", "nvidia", "l40s"),
        ("Tesla T4", "nvidia", "t4"),
        ("Tesla V100-SXM2-16GB", "nvidia", "v100"),
        ("NVIDIA GeForce RTX 4090", "nvidia", "rtx4090"),
        ("NVIDIA GeForce RTX 3080 Ti", "nvidia", "rtx3080ti"),
        ("NVIDIA RTX A6000", "nvidia", "a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "nvidia", "rtx6000ada"),
        ("NVIDIA Foo 9000", "nvidia", "foo-9000"),
        ("AMD Instinct MI300X", "amd", "mi300x"),
        ("Apple M2 Pro", "apple", "m2"),
        ("Apple M3 Max", "apple", "m3"),
        ("a100-80gb", "sim", "a100"),
    ],
)
def test_normalize_kind(name: str, vendor: str, kind: str) -> None:
    assert normalize_kind(name, vendor) == kind


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("a100-80gb", ("a100", 80 * GIB)),
        ("A100 40GB", ("a100", 40 * GIB)),
        ("H100", ("h100", None)),
        ("a10g", ("a10g", None)),  # the "g" is part of the name, not a size
        ("l4-24gb", ("l4", 24 * GIB)),
        ("sim", ("sim", None)),
        ("NVIDIA A100-SXM4-40GB", ("a100", 40 * GIB)),
        ("mi300x", ("mi300x", None)),
    ],
)
def test_parse_kind(spec: str, expected: tuple[str, int | None]) -> None:
    assert parse_kind(spec) == expected


def test_format_bytes() -> None:
    assert format_bytes(80 * GIB) == "80 GiB"
    assert format_bytes(int(1.5 * GIB)) == "1.5 GiB"
    assert format_bytes(512 << 20) == "512 MiB"
