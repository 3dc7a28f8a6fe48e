"""Two real ranks (gloo on CPU): DDP equals one process on the whole batch; torchrun example."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from gpulayer_kernel.torch import (  # noqa: E402
    LossNotFinite,
    Trainer,
    TrainerConfig,
    all_reduce_mean,
    barrier,
    destroy_distributed,
    distributed_loader,
    init_distributed,
    rank,
    world_size,
)
from gpulayer_kernel.torch.testing import TinyRegressor, regression_data, spawn_ranks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS, PER_RANK_BATCH, ACCUMULATE = 4, 4, 2


def _rank_main(out_dir: str) -> None:
    """One rank: train with DDP and accumulation, then hit a NaN on rank 1 only."""
    assert init_distributed() is True and init_distributed() is True  # idempotent
    torch.manual_seed(0)
    model = TinyRegressor()
    loader = distributed_loader(regression_data(64), PER_RANK_BATCH, shuffle=True, seed=5)
    val = distributed_loader(regression_data(16, seed=1), 4, shuffle=False)
    config = TrainerConfig(
        max_steps=STEPS, accumulate=ACCUMULATE, log_every=2, checkpoint_dir=out_dir
    )
    result = Trainer(config).fit(model, loader, val)
    mean_rank = all_reduce_mean(torch.tensor([float(rank())]))
    barrier()
    error = None
    try:  # only rank 1 sees a NaN (its 3rd batch: step 3); both must stop naming step 3
        bad = TinyRegressor(nan_at_call=2 if rank() == 1 else None)
        Trainer(TrainerConfig(max_steps=6, log_every=3, checkpoint_at_end=False)).fit(bad, loader)
    except LossNotFinite as exc:
        error = {"step": exc.step, "rank": exc.rank, "message": exc.message}
    torch.save(
        {
            "params": model.state_dict(),
            "metrics": result.metrics,
            "world": world_size(),
            "mean_rank": mean_rank,
            "checkpoint": str(result.checkpoint),
            "error": error,
        },
        os.path.join(out_dir, f"rank{rank()}.pt"),
    )
    destroy_distributed()


def test_two_ranks_equal_one_process_on_the_concatenated_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawn_ranks(_rank_main, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]

    # One process, one batch per step holding both ranks' micro-batches, in the same order.
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)
    single = TinyRegressor()
    loader = distributed_loader(regression_data(64), PER_RANK_BATCH * 2 * ACCUMULATE, seed=5)
    val = DataLoader(regression_data(16, seed=1), batch_size=8)
    config = TrainerConfig(max_steps=STEPS, log_every=2, checkpoint_at_end=False)
    result = Trainer(config).fit(single, loader, val)

    for r in ranks:
        assert r["world"] == 2 and r["mean_rank"].item() == 0.5
        for name, value in single.state_dict().items():
            torch.testing.assert_close(r["params"][name], value, rtol=1e-5, atol=1e-6)
        # Metrics are reduced across ranks, so both ranks report the single process's values.
        assert r["metrics"]["loss"] == pytest.approx(result.metrics["loss"], rel=1e-5)
        assert r["metrics"]["val_loss"] == pytest.approx(result.metrics["val_loss"], rel=1e-5)
        assert r["error"] is not None and (r["error"]["step"], r["error"]["rank"]) == (3, 1)
    assert "loss is nan at step 3" in ranks[1]["error"]["message"]
    assert "not finite on rank 1 at step 3" in ranks[0]["error"]["message"]

    # Rank zero wrote the checkpoint, with every rank's RNG streams in it.
    checkpoint = torch.load(ranks[0]["checkpoint"], weights_only=True)
    assert ranks[1]["checkpoint"] == ranks[0]["checkpoint"]
    assert len(checkpoint["rng"]) == 2
    assert not torch.equal(checkpoint["rng"][0]["torch"], checkpoint["rng"][1]["torch"])


def test_allreduce_example_under_torchrun() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "examples" / "allreduce.py"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    assert sorted(re.findall(r"rank (\d): sum = (\d+)", done.stdout)) == [("0", "3"), ("1", "3")]
