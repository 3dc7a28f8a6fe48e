"""The probe's readers against recorded outputs and fake modules: it never crashes."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpulayer_kernel.capabilities.probe import main
from gpulayer_kernel.capabilities.readers import (
    SMI_QUERY,
    SmiResult,
    import_optional,
    parse_nvidia_smi,
    probe,
    read_nvidia_smi,
    read_nvml,
    run_command,
)
from gpulayer_kernel.contracts import HostFacts, WorkerCapabilities

from .fakes import GIB, fake_nvml, fake_torch

DATA = Path(__file__).parent / "data"
MIB = 1 << 20
HOST = HostFacts(hostname="box", os="linux", arch="x86_64", cpus=16, memory_bytes=64 * GIB)


def recorded(name: str, returncode: int = 0) -> SmiResult:
    return SmiResult(returncode=returncode, stdout=(DATA / name).read_text())


class smi_from:
    """An nvidia-smi runner that returns a recorded result and remembers what it was asked."""

    def __init__(self, result: SmiResult) -> None:
        self.result = result
        self.asked: list[Sequence[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> SmiResult:
        self.asked.append(argv)
        return self.result


def never_smi(argv: Sequence[str], timeout: float) -> SmiResult:
    raise AssertionError("nvidia-smi should not have been run")


# -- nvidia-smi ---------------------------------------------------------------------------------


def test_parse_h100_x8() -> None:
    found = parse_nvidia_smi((DATA / "nvidia_smi_h100x8.csv").read_text())
    assert found.errors == []
    assert found.driver == "550.54.15"
    assert [d.index for d in found.devices] == list(range(8))
    d = found.devices[3]
    assert (d.vendor, d.name, d.kind) == ("nvidia", "NVIDIA H100 80GB HBM3", "h100")
    assert d.memory_bytes == 81559 * MIB
    assert d.compute_capability == "9.0"
    assert d.uuid == "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d04"


@pytest.mark.parametrize(
    ("name", "kind", "count", "memory_mib", "cc"),
    [
        ("nvidia_smi_a100.csv", "a100", 1, 40960, "8.0"),
        ("nvidia_smi_l4.csv", "l4", 2, 23034, "8.9"),
        ("nvidia_smi_old_driver.csv", "t4", 1, 15360, None),
    ],
)
def test_parse_other_cards(
    name: str, kind: str, count: int, memory_mib: int, cc: str | None
) -> None:
    found = parse_nvidia_smi((DATA / name).read_text())
    assert found.errors == []
    assert len(found.devices) == count
    assert {(d.kind, d.memory_bytes, d.compute_capability) for d in found.devices} == {
        (kind, memory_mib * MIB, cc)
    }


def test_failed_driver_is_a_reason_not_a_crash() -> None:
    found = read_nvidia_smi(smi_from(recorded("nvidia_smi_failed.txt", returncode=9)))
    assert found.devices == []
    assert found.errors == [
        "nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver. Make sure that the latest NVIDIA driver is installed and running."
    ]


def test_garbage_lines_and_odd_exit_codes_are_reported() -> None:
    found = parse_nvidia_smi("0, NVIDIA L4, 23034, GPU-x, 550.90.07, 8.9\nwhat is this\n")
    assert len(found.devices) == 1
    assert found.errors == ["nvidia-smi: line 2 not understood: ['what is this']"]
    odd = read_nvidia_smi(
        smi_from(SmiResult(returncode=4, stdout="", stderr="Insufficient Permissions"))
    )
    assert odd.errors == ["nvidia-smi: exit status 4: Insufficient Permissions"]
    assert parse_nvidia_smi("No devices were found\n").devices == []
    assert parse_nvidia_smi("No devices were found\n").errors == []


def test_the_query_asks_for_the_documented_fields() -> None:
    runner = smi_from(recorded("nvidia_smi_l4.csv"))
    read_nvidia_smi(runner, timeout=3.0)
    assert runner.asked == [SMI_QUERY]
    assert SMI_QUERY[1] == "--query-gpu=index,name,memory.total,uuid,driver_version,compute_cap"


def test_a_hung_nvidia_smi_times_out(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = run_command([str(fake)], timeout=0.5)
    assert result.error == "timed out after 0.5 s"
    found = read_nvidia_smi(smi_from(SmiResult(error="timed out after 10 s")))
    assert found.errors == ["nvidia-smi: timed out after 10 s"]


def test_a_missing_nvidia_smi_is_a_reason() -> None:
    assert run_command(["gpulayer-no-such-program-xyz"], 1.0).error == "not found on PATH"


# -- probe(): the sources together ----------------------------------------------------------------


def test_torch_absent_uses_the_driver() -> None:
    caps = probe(
        torch=None, nvml=None, smi=smi_from(recorded("nvidia_smi_h100x8.csv")), env={}, host=HOST
    )
    assert len(caps.devices) == 8 and caps.devices[0].kind == "h100"
    assert caps.cuda_driver == "550.54.15"
    assert caps.frameworks.torch_version is None  # reported, never assumed
    assert caps.probe_sources == ["nvidia-smi"]
    assert (caps.runtime, caps.dist_backend) == ("cuda", None)
    assert caps.probe_errors == []


def test_torch_present_gives_devices_and_the_driver_gives_its_version() -> None:
    torch = fake_torch([("NVIDIA H100 80GB HBM3", 80 * GIB, 9, 0)] * 2)
    caps = probe(
        torch=torch, nvml=None, smi=smi_from(recorded("nvidia_smi_h100x8.csv")), env={}, host=HOST
    )
    assert [d.index for d in caps.devices] == [0, 1]
    assert caps.devices[1].uuid == "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d01"
    assert caps.devices[0].compute_capability == "9.0"
    f = caps.frameworks
    assert (f.torch_version, f.torch_cuda, f.cuda_available, f.device_count) == (
        "2.13.0+cu124",
        "12.4",
        True,
        2,
    )
    assert f.distributed_backends == ["gloo", "nccl"]
    assert caps.cuda_driver == "550.54.15"
    assert caps.probe_sources == ["torch", "nvidia-smi"]
    assert (caps.runtime, caps.dist_backend) == ("cuda", "nccl")


def test_cpu_only_torch_on_a_gpu_box_still_offers_the_gpus() -> None:
    torch = fake_torch([], version="2.13.0+cpu", cuda=None, backends=("gloo",))
    caps = probe(
        torch=torch, nvml=None, smi=smi_from(recorded("nvidia_smi_l4.csv")), env={}, host=HOST
    )
    assert [d.kind for d in caps.devices] == ["l4", "l4"]
    assert not caps.frameworks.cuda_available
    assert (caps.runtime, caps.dist_backend) == ("cuda", "gloo")


def test_broken_torch_cuda_is_reported_and_the_driver_answers() -> None:
    torch = fake_torch(cuda_error=RuntimeError("CUDA driver initialization failed"))
    caps = probe(
        torch=torch, nvml=None, smi=smi_from(recorded("nvidia_smi_a100.csv")), env={}, host=HOST
    )
    assert caps.probe_errors == ["torch.cuda: RuntimeError: CUDA driver initialization failed"]
    assert [d.kind for d in caps.devices] == ["a100"]


def test_rocm_torch_reports_amd_devices() -> None:
    torch = fake_torch([("AMD Instinct MI300X", 192 * GIB, 9, 4)], cuda=None, hip="6.2.41133")
    caps = probe(torch=torch, nvml=None, smi=never_smi, env={}, host=HOST)
    (d,) = caps.devices
    assert (d.vendor, d.kind, d.compute_capability) == ("amd", "mi300x", "gfx942")
    assert caps.frameworks.torch_hip == "6.2.41133"
    assert caps.runtime == "rocm"


def test_apple_mps_reports_one_unified_memory_device() -> None:
    mac = HostFacts(hostname="mac", os="darwin", arch="arm64", cpus=12, memory_bytes=32 * GIB)
    torch = fake_torch(version="2.13.0", cuda=None, mps=True, backends=("gloo",))
    caps = probe(torch=torch, nvml=None, smi=never_smi, env={}, host=mac, apple_chip="Apple M2 Pro")
    (d,) = caps.devices
    assert (d.vendor, d.kind, d.name, d.unified_memory, d.memory_bytes) == (
        "apple",
        "m2",
        "Apple M2 Pro",
        True,
        32 * GIB,
    )
    assert (caps.runtime, caps.dist_backend) == ("mps", None)


def test_nvml_is_preferred_over_nvidia_smi() -> None:
    nvml = fake_nvml([("NVIDIA A100-SXM4-80GB", 80 * GIB, (8, 0))] * 2)
    caps = probe(torch=None, nvml=nvml, smi=never_smi, env={}, host=HOST)
    assert [d.kind for d in caps.devices] == ["a100", "a100"]
    assert caps.devices[0].compute_capability == "8.0"
    assert caps.cuda_driver == "550.54.15"
    assert caps.probe_sources == ["nvml"]
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_failure_falls_back_to_nvidia_smi() -> None:
    nvml = fake_nvml(init_error=RuntimeError("Driver Not Loaded"))
    caps = probe(
        torch=None, nvml=nvml, smi=smi_from(recorded("nvidia_smi_l4.csv")), env={}, host=HOST
    )
    assert caps.probe_errors == ["nvml: RuntimeError: Driver Not Loaded"]
    assert caps.probe_sources == ["nvidia-smi"] and len(caps.devices) == 2
    assert read_nvml(nvml).errors == ["nvml: RuntimeError: Driver Not Loaded"]


def test_cuda_visible_devices_renumbers_driver_devices() -> None:
    smi = smi_from(recorded("nvidia_smi_h100x8.csv"))
    caps = probe(torch=None, nvml=None, smi=smi, env={"CUDA_VISIBLE_DEVICES": "5,2"}, host=HOST)
    assert [(d.index, d.uuid) for d in caps.devices] == [
        (0, "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d06"),
        (1, "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d03"),
    ]
    by_uuid = probe(
        torch=None,
        nvml=None,
        smi=smi,
        env={"CUDA_VISIBLE_DEVICES": "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d08"},
        host=HOST,
    )
    assert [d.index for d in by_uuid.devices] == [0]
    hidden = probe(torch=None, nvml=None, smi=smi, env={"CUDA_VISIBLE_DEVICES": ""}, host=HOST)
    assert hidden.devices == []


def test_nothing_works_gives_cpu_only_with_reasons() -> None:
    caps = probe(
        torch=None,
        nvml=fake_nvml(init_error=OSError("libnvidia-ml.so.1: cannot open shared object file")),
        smi=smi_from(recorded("nvidia_smi_failed.txt", returncode=9)),
        env={},
        host=HOST,
    )
    assert caps.devices == [] and caps.runtime == "cpu"
    assert (
        caps.probe_errors[0] == "nvml: OSError: libnvidia-ml.so.1: cannot open shared object file"
    )
    assert caps.probe_errors[1].startswith("nvidia-smi: NVIDIA-SMI has failed")


def test_import_optional_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert import_optional("gpulayer_no_such_module_xyz") == (None, "not installed")
    (tmp_path / "gpulayer_broken_xyz.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module, why = import_optional("gpulayer_broken_xyz")
    assert module is None
    assert why == "import failed: OSError: libcudart.so.12: cannot open shared object file"
    sys.modules.pop("gpulayer_broken_xyz", None)


# -- the program ----------------------------------------------------------------------------------


def test_main_prints_one_line_of_capabilities_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-torch", "--simulate-gpus", "2", "--simulate-kind", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    caps = WorkerCapabilities.model_validate(json.loads(out))
    assert caps.simulated and [d.kind for d in caps.devices] == ["h100", "h100"]
    assert caps.devices[0].memory_bytes == 80 * GIB
    assert caps.frameworks.torch_version is None
    assert caps.host.cpus == len(os.sched_getaffinity(0))
