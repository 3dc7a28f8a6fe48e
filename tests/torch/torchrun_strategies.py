"""Run by tests/torch/test_strategies.py as 2 ranks under real torchrun (gloo on the CPU).

``python -m torch.distributed.run --nproc-per-node 2 torchrun_strategies.py OUT`` runs every
scenario below once, in one launch (each launch costs seconds of ``import torch``), and each rank
saves what it saw to ``OUT/rank<R>.pt``; the tests read those files. A scenario that raises is
recorded as its error, so the others still run.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gpulayer_kernel.torch import (
    Module,
    Trainer,
    TrainerConfig,
    UnusedParameters,
    distributed_loader,
    init_distributed,
    rank,
)
from gpulayer_kernel.torch.testing import regression_data

STEPS, PER_RANK = 4, 4


class Blocks(Module):
    """A small MLP whose two hidden layers are FSDP units of their own."""

    def __init__(self, extra: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, 16)
        self.hidden = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(2)])
        self.out = torch.nn.Linear(16, 1)
        self.extra = torch.nn.Linear(4, 4)  # used only as ``extra`` says
        self.use_extra, self.calls = extra, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        out: torch.Tensor = self.out(h)
        return out

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        used = self.use_extra == "always" or (self.use_extra == "first" and self.calls == 0)
        self.calls += 1
        if used:
            loss = loss + 0.0 * self.extra(torch.ones(1, 4)).sum()
        return loss

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"loss": F.mse_loss(self(x), y)}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def fsdp_units(self) -> list[torch.nn.Module]:
        return list(self.hidden)


class GAN(Module):
    """A tiny GAN in Lightning's manual style; the noise comes with the batch (no RNG)."""

    automatic_optimization = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.d = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def training_step(self, batch: Any) -> torch.Tensor:
        real, z = batch[0], batch[0][:, :4]
        opt_g, opt_d = self.optimizers()
        fake = self.g(z)
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        d_loss = F.binary_cross_entropy_with_logits(
            self.d(real), ones
        ) + F.binary_cross_entropy_with_logits(self.d(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = F.binary_cross_entropy_with_logits(self.d(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=1.0)
        opt_g.step()
        return g_loss

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.g.parameters(), lr=0.01),
            torch.optim.Adam(self.d.parameters(), lr=0.02),
        ]


def loaders() -> tuple[Any, Any]:
    train = distributed_loader(regression_data(64), PER_RANK, shuffle=True, seed=3)
    val = distributed_loader(regression_data(16, seed=1), 4, shuffle=False)
    return train, val


def gan_loader() -> Any:
    return distributed_loader(regression_data(32), PER_RANK, shuffle=False)


def config(out: Path, name: str, **fields: Any) -> TrainerConfig:
    fields.setdefault("max_steps", STEPS)
    return TrainerConfig(log_every=2, checkpoint_dir=str(out / name), **fields)


def full_params(result: Any) -> dict[str, torch.Tensor]:
    """The model as its full checkpoint holds it (plain torch, weights_only)."""
    state = torch.load(result.checkpoint, map_location="cpu", weights_only=True)["model"]
    return {k: v.clone() for k, v in state.items()}


def scenarios(out: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            seen[name] = fn()
        except Exception as exc:  # recorded: the test names the scenario that failed
            seen[name] = {"error": type(exc).__name__, "message": str(exc)}
            seen[name]["trace"] = traceback.format_exc()

    def ddp() -> Any:
        train, val = loaders()
        model = Blocks()
        model.extra.requires_grad_(False)  # the documented remedy for a parameter never used
        result = Trainer(config(out, "ddp", accumulate=2, grad_clip=1.0), loggers=[]).fit(
            model, train, val
        )
        return {"params": full_params(result), "val_loss": result.metrics["val_loss"]}

    def fsdp_full() -> Any:
        train, val = loaders()
        trainer = Trainer(
            config(out, "fsdp", strategy="fsdp", accumulate=2, grad_clip=1.0), loggers=[]
        )
        model = Blocks()
        model.extra.requires_grad_(False)  # as in ddp() (FSDP itself needs no such thing)
        result = trainer.fit(model, train, val)
        after = trainer.validate(model, val)  # the module is still sharded: through the root
        local = model.hidden[0].weight.to_local().shape  # type: ignore[operator]
        return {
            "params": full_params(result),
            "val_loss": result.metrics["val_loss"],
            "validate": after["val_loss"],
            "local_shape": tuple(local),
            "checkpoint": str(result.checkpoint),
        }

    def fsdp_sharded() -> Any:
        train, _ = loaders()
        cfg = config(
            out,
            "sharded",
            strategy="fsdp",
            checkpoint_format="sharded",
            checkpoint_every=2,
            keep_checkpoints=2,
        )
        first = Trainer(cfg, loggers=[]).fit(Blocks(), train)
        resumed_model = Blocks()
        resumed = Trainer(cfg.model_copy(update={"checkpoint_dir": str(out / "resumed")}))
        again = resumed.fit(resumed_model, train, resume=str(out / "sharded/step-00000002.dcp"))
        # the full checkpoint of the same fit, for the test to compare the shards with
        full = Trainer(config(out, "unsharded", strategy="fsdp"), loggers=[]).fit(Blocks(), train)
        return {
            "dirs": sorted(p.name for p in (out / "sharded").iterdir()),
            "last": str(first.checkpoint),
            "resumed_last": str(again.checkpoint),
            "resumed_step": again.step,
            "full": full_params(full),
        }

    def unused(extra: str, **fields: Any) -> Any:
        def fit() -> Any:
            train, _ = loaders()
            model = Blocks(extra=extra)
            before = model.extra.weight.detach().clone()
            try:
                result = Trainer(config(out, f"unused-{extra}", **fields), loggers=[]).fit(
                    model, train
                )
            except UnusedParameters as exc:
                return {"code": exc.code, "message": exc.message, "hint": exc.hint}
            return {"step": result.step, "extra_kept": bool((model.extra.weight == before).all())}

        return fit

    def gan() -> Any:
        model = GAN()
        result = Trainer(config(out, "gan"), loggers=[]).fit(model, gan_loader())
        saved = torch.load(result.checkpoint, weights_only=True)
        return {
            "params": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizers": len(saved["optimizers"]),
            "loss": result.metrics["loss"],
        }

    run("ddp", ddp)
    run("fsdp_full", fsdp_full)
    run("fsdp_sharded", fsdp_sharded)
    run("unused_never", unused("never"))
    run("unused_later", unused("first"))
    run("unused_option", unused("never", find_unused_parameters=True))
    run("unused_static", unused("never", static_graph=True))
    run("gan", gan)
    return seen


def main() -> None:
    out = Path(sys.argv[1])
    init_distributed()
    torch.set_num_threads(1)
    seen = scenarios(out)
    torch.save(seen, out / f"rank{rank()}.pt")
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown, which can abort after a failed collective


if __name__ == "__main__":
    main()
