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
    CSVLogger,
    EarlyStopping,
    LossNotFinite,
    ModelCheckpoint,
    Trainer,
    TrainerConfig,
    accumulate,
    all_reduce_mean,
    backward,
    barrier,
    destroy_distributed,
    distributed_loader,
    gather,
    init_distributed,
    prepare,
    rank,
    save_state,
    unwrap,
    world_size,
)
from gpulayer_kernel.torch.testing import (  # noqa: E402
    LoggingRegressor,
    RecordingCallback,
    TinyRegressor,
    regression_data,
    spawn_ranks,
)

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


def _features_main(out_dir: str) -> None:
    """One rank: callbacks, self.log, a logger, early stopping, best-k; then the own loop."""
    init_distributed()
    out = Path(out_dir)
    torch.manual_seed(0)
    recorder = RecordingCallback()
    # A constant lr never improves: the second check (step 4) stops, the same step on both ranks.
    stopper = EarlyStopping("lr", patience=1)
    saver = ModelCheckpoint(out / "ckpt", monitor="val_mae", save_top_k=2, save_last=True)
    trainer = Trainer(
        max_steps=20,
        log_every=2,
        val_every=2,
        callbacks=[recorder, stopper, saver],
        loggers=[CSVLogger(out / "logs")],
    )
    result = trainer.fit(
        LoggingRegressor(sync_dist=True),
        distributed_loader(regression_data(64), 4, seed=5),
        distributed_loader(regression_data(16, seed=1), 4, shuffle=False),
    )

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=4)
    model, optimizer, loader = prepare(model, optimizer, loader, accumulate=2)
    for i, (x, y) in enumerate(loader):
        with accumulate(model):
            backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        if i == 3:  # two optimizer steps
            break
    gathered = gather(torch.tensor([float(rank())]))
    save_state(out / "state")
    torch.save(
        {
            "step": result.step,
            "stopped": result.stopped,
            "rank_metric": result.metrics["rank"],
            "train_mae": result.metrics["train_mae_step"],
            "best": str(result.best_checkpoint),
            "calls": recorder.calls,
            "own_loop": unwrap(model).state_dict(),
            "gathered": gathered,
        },
        out / f"features-rank{rank()}.pt",
    )
    destroy_distributed()


def test_callbacks_metrics_loggers_and_own_loop_on_two_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawn_ranks(_features_main, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"features-rank{r}.pt", weights_only=True) for r in (0, 1)]
    # Early stopping is rank zero's decision, broadcast: both ranks stop at step 4.
    assert [r["step"] for r in ranks] == [4, 4]
    assert (
        ranks[0]["stopped"] == ranks[1]["stopped"]
        and "early stopping at step 4" in (ranks[0]["stopped"])
    )
    assert ranks[0]["calls"] == ranks[1]["calls"]  # every rank heard the same hooks
    # sync_dist=True: one value everywhere; without it each rank keeps its own.
    assert ranks[0]["train_mae"] == pytest.approx(ranks[1]["train_mae"])
    assert [r["rank_metric"] for r in ranks] == [0.0, 1.0]
    # Best-k: rank zero wrote the files (two best and last.pt), both ranks name the same best.
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(files) == 3 and "last.pt" in files
    assert ranks[0]["best"] == ranks[1]["best"] and Path(ranks[0]["best"]).is_file()
    # The CSV logger ran on rank zero only: one header, one row per boundary (steps 2 and 4).
    lines = (tmp_path / "logs" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("step,")

    # Own loop: two ranks of 4-sample micro-batches, accumulate=2, equal one process on 16.
    assert [r["gathered"].tolist() for r in ranks] == [[0.0, 1.0]] * 2
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)
    single = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
    for x, y in list(torch.utils.data.DataLoader(regression_data(64), batch_size=16))[:2]:
        torch.nn.functional.mse_loss(single(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    for r in ranks:
        for name, value in single.state_dict().items():
            torch.testing.assert_close(r["own_loop"][name], value, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "state" / "state.pt").is_file()
