"""Runtime helpers in a single process, device choice, and the package's public surface."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import gpulayer_kernel.torch as gt  # noqa: E402
from gpulayer_kernel.job import ranks  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_single_process_answers() -> None:
    assert gt.init_distributed() is False
    assert gt.init_distributed() is False  # idempotent
    assert not torch.distributed.is_initialized()
    assert (gt.rank(), gt.world_size(), gt.local_rank()) == (0, 1, 0)
    assert gt.is_rank_zero()
    gt.barrier()  # returns at once without a group
    gt.destroy_distributed()
    gt.destroy_distributed()  # safe twice


def test_environment_is_read_before_a_group_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert (gt.rank(), gt.world_size(), gt.local_rank()) == (3, 4, 1)
    assert not gt.is_rank_zero()


def test_all_reduce_mean_returns_a_new_detached_tensor() -> None:
    value = torch.tensor([1.0, 3.0], requires_grad=True)
    mean = gt.all_reduce_mean(value)
    assert torch.equal(mean, value.detach())
    assert mean is not value and not mean.requires_grad
    mean.add_(1)
    assert torch.equal(value.detach(), torch.tensor([1.0, 3.0]))  # the input is untouched
    assert gt.all_reduce_mean(torch.tensor([2, 4])).is_floating_point()


def test_print0_prints_only_on_rank_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gt.print0("hello", 1)
    monkeypatch.setenv("RANK", "1")
    gt.print0("from rank one")
    assert capsys.readouterr().out == "hello 1\n"


@pytest.mark.parametrize(
    ("cuda", "count", "local", "mps", "expected"),
    [
        (True, 4, "2", False, "cuda:2"),
        (True, 1, "3", False, "cuda:0"),  # one visible GPU per rank (CUDA_VISIBLE_DEVICES)
        (False, 0, "0", True, "mps"),
        (False, 0, "1", False, "cpu"),
    ],
)
def test_device_prefers_cuda_then_mps_then_cpu(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, count: int, local: str, mps: bool, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setenv("LOCAL_RANK", local)
    assert gt.device() == torch.device(expected)


def test_device_refuses_a_local_rank_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 but only 2 CUDA devices"):
        gt.device()


def test_seed_everything_makes_every_stream_repeat() -> None:
    import random

    np = pytest.importorskip("numpy")
    gt.seed_everything(7)
    first = (torch.rand(2), random.random(), np.random.rand())
    gt.seed_everything(7)
    second = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(first[0], second[0]) and first[1:] == second[1:]


def test_public_names_resolve_and_are_sorted() -> None:
    names = gt.__all__
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(gt, name) is not None

    def kind(name: str) -> tuple[int, str]:  # constants, then classes, then functions
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert names == sorted(names, key=kind)
    assert ranks.device is gt.device


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
def test_import_does_not_touch_cuda() -> None:
    # Replace every CUDA entry point with a tripwire, then import the whole package.
    code = (
        "import torch\n"
        "def boom(*a, **k):\n"
        "    raise SystemExit('CUDA touched at import')\n"
        "for name in ('_lazy_init', 'init', 'is_available', 'device_count', 'set_device'):\n"
        "    setattr(torch.cuda, name, boom)\n"
        "import gpulayer_kernel.torch, gpulayer_kernel.torch.testing\n"
        "print('imported')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"
