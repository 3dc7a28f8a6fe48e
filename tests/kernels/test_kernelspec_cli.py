"""``gpulayer kernelspec install|list|remove`` on a private Jupyter data dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulayer_kernel.cli.main import main


def test_install_list_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "data"))
    assert main(["kernelspec", "install", "--gpus", "2", "--user", "--wait", "60"]) == 0
    spec = json.loads((tmp_path / "data/kernels/gpulayer-2gpu/kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (GPUlayer · 2 GPUs)"
    prov = spec["metadata"]["kernel_provisioner"]
    assert prov == {
        "provisioner_name": "gpulayer-provisioner",
        "config": {"gpus": 2, "gpu_kind": [], "max_wait": 60.0},
    }
    assert main(["kernelspec", "install", "--user", "--gpu-kind", "A100"]) == 0
    capsys.readouterr()
    assert main(["kernelspec", "list"]) == 0
    listed = capsys.readouterr().out
    assert "gpulayer-2gpu\tPython 3 (GPUlayer · 2 GPUs)" in listed
    assert "gpulayer-1gpu-a100\tPython 3 (GPUlayer · 1 A100 GPU)" in listed
    assert main(["kernelspec", "remove", "gpulayer-2gpu"]) == 0
    assert main(["kernelspec", "remove", "gpulayer-2gpu"]) == 2  # not ours any more: a clear error
    err = capsys.readouterr().err
    assert "no GPUlayer kernel spec 'gpulayer-2gpu'" in err
    assert main(["kernelspec", "install", "--user", "--name", "Bad Name"]) == 2
