"""Strategies under real torchrun with 2 gloo ranks: FSDP2 (fully_shard) against DDP, sharded and
full checkpoints read back with plain torch, unused parameters named under DDP, the DDP options
passed through, and manual optimization (a GAN) averaged across ranks.

One torchrun launch runs every scenario (``torchrun_strategies.py``); each test reads what the
ranks saved. Comparisons are against runs in this process, on the same data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402

from gpulayer_kernel.torch import Trainer  # noqa: E402
from gpulayer_kernel.torch.testing import free_port, regression_data  # noqa: E402

from .torchrun_strategies import GAN, Blocks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of the 2 ranks saw, after one real ``torchrun --nproc-per-node 2``."""
    out = tmp_path_factory.mktemp("strategies")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "RANK"))}
    env.update(PYTHONPATH=str(ROOT), GPULAYER_OUTPUT=str(out / "output"))
    for name in ("WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(HERE / "torchrun_strategies.py"),
        str(out),
    ]
    # Its own process group: a timeout ends torchrun's ranks too, not only torchrun.
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=out,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail("torchrun did not finish in 100 s:\n" + output[-3000:])
    done = subprocess.CompletedProcess(command, proc.returncode, output, "")
    assert done.returncode == 0, done.stdout[-3000:]
    seen = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for rank_seen in seen:
        for name, value in rank_seen.items():
            assert not (isinstance(value, dict) and "trace" in value), f"{name}: {value}"
    return seen


def load_sharded(directory: str) -> dict[str, torch.Tensor]:
    """A sharded checkpoint's model, read with plain torch.distributed.checkpoint (no group)."""
    model = Blocks()
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process, yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=directory)
    model.load_state_dict(state["model"])
    return model.state_dict()


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol) for k in a)


def test_fsdp_trains_what_ddp_trains_with_its_parameters_sharded(
    ranks: list[dict[str, Any]],
) -> None:
    ddp, fsdp = ranks[0]["ddp"], ranks[0]["fsdp_full"]
    # accumulation (no gradient sync on the first micro-batch), clipping of DTensor gradients
    # and validation through the sharded root, all as DDP does them
    assert close(fsdp["params"], ddp["params"]), "FSDP's parameters differ from DDP's"
    assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], rel=1e-6)
    assert fsdp["validate"] == pytest.approx(fsdp["val_loss"], rel=1e-6)  # after the fit, too
    assert fsdp["local_shape"] == (8, 16), "each rank holds half of a 16x16 weight"
    assert ranks[1]["fsdp_full"]["local_shape"] == (8, 16)
    # the full checkpoint is one plain file: torch.load(weights_only=True) and load_state_dict
    model = Blocks()
    state = torch.load(fsdp["checkpoint"], weights_only=True)
    model.load_state_dict(state["model"])
    assert state["config"]["strategy"] == "fsdp"


def test_sharded_checkpoints_resume_exactly_and_load_with_plain_torch(
    ranks: list[dict[str, Any]],
) -> None:
    seen = ranks[0]["fsdp_sharded"]
    assert seen["dirs"] == ["step-00000002.dcp", "step-00000004.dcp"]  # keep_checkpoints=2
    last = Path(seen["last"])
    assert sorted(p.name for p in last.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "trainer.pt",
    ], "each rank wrote its own shard file; rank zero the trainer state"
    uninterrupted = load_sharded(seen["last"])
    resumed = load_sharded(seen["resumed_last"])
    assert seen["resumed_step"] == 4
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)
    assert close(uninterrupted, seen["full"]), "the shards hold the model the full file holds"
    rest = torch.load(last / "trainer.pt", weights_only=True)
    assert rest["step"] == 4 and "model" not in rest and len(rest["rng"]) == 2


def test_parameters_outside_the_loss_are_named_with_both_remedies(
    ranks: list[dict[str, Any]],
) -> None:
    for seen in ranks:
        for case, when in (("unused_never", "in the first step"), ("unused_later", "later")):
            error = seen[case]
            assert error["code"] == "unused_parameters", error
            assert "extra.weight, extra.bias" in error["message"] and when in error["message"]
            assert "module.extra.requires_grad_(False)" in error["hint"]
            assert "find_unused_parameters=True" in error["hint"]
            assert "static_graph=True" in error["hint"]
            assert "Expected to have finished reduction" not in error["message"]


def test_find_unused_parameters_and_static_graph_reach_ddp(ranks: list[dict[str, Any]]) -> None:
    for seen in ranks:
        assert seen["unused_option"] == {"step": 4, "extra_kept": True}
        assert seen["unused_static"] == {"step": 4, "extra_kept": True}


def test_a_gan_in_manual_style_on_two_ranks_equals_one_process_on_the_whole_batch(
    ranks: list[dict[str, Any]], single_process: Path
) -> None:
    data = regression_data(32)
    model = GAN()
    batches = [data[i : i + 8] for i in range(0, 32, 8)]  # both ranks' batches of 4, together
    result = Trainer(max_steps=4, log_every=2, loggers=[], checkpoint_at_end=False).fit(
        model, batches
    )
    assert result.step == 4
    gan = ranks[0]["gan"]
    assert gan["optimizers"] == 2, "the checkpoint keeps both optimizers' state"
    assert close(gan["params"], model.state_dict(), atol=1e-5)
    assert close(ranks[1]["gan"]["params"], gan["params"], atol=0.0), "the replicas agree"
