"""Throughput of gpulayer's Trainer against a hand-written PyTorch loop (and Lightning).

Usage::

    .venv/bin/python benchmarks/bench_trainer.py            # CPU: MLP and a transformer block
    .venv/bin/python benchmarks/bench_trainer.py --quick    # a few short rounds (CI smoke test)
    .venv/bin/python benchmarks/bench_trainer.py --gpu      # bf16 GPT-style model, samples/s + MFU
    .venv/bin/python benchmarks/bench_trainer.py --threads 1 --clock cpu   # on a busy machine

Method (/work/shared/BENCHMARKING.md): the same model, data in memory as tensors, fixed
``torch.set_num_threads``; each round runs every contender once (A B C, B C A, C A B, ...) on a
fresh copy of the same initial weights; we report the median of the per-round ratios to the
raw loop and their spread (min-max), because these machines vary +-15% between rounds.
Each fit runs ``--steps`` optimizer steps; throughput is timed from the fetch of batch 5 to
that of the last batch (steady state, one metrics reduction of the Trainer inside), and
set-up time until the first batch is printed separately.

"With metrics" rows (issue 17), MLP only: the Trainer with ``self.log`` of loss and accuracy
every step (``prog_bar=True``) and a CSVLogger, and Lightning with the same ``self.log(...,
prog_bar=True)``, its progress bar and its CSVLogger. The last line is
``trainer_with_metrics/raw ratio: R``.

``--fsdp`` (issue 36) also runs ``bench_fsdp.py`` under ``torchrun --nproc-per-node 2`` (gloo on
the CPU; NCCL with ``--gpu``): the Trainer's ``strategy="fsdp"`` against a hand-written
``fully_shard`` loop of the same model, and whether both end with the same parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from gpulayer_kernel.torch import CSVLogger, Module, Trainer, TrainerConfig

Batches = list[tuple[torch.Tensor, torch.Tensor]]

# Wall time by default (what a user waits for). --clock cpu uses this process's CPU time
# instead, which time-slicing by other processes on a shared machine does not inflate; with
# --threads 1 it is the steadier figure there.
CLOCK: list[Callable[[], float]] = [time.perf_counter]


# --- models ---------------------------------------------------------------------------------


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


class GPT(torch.nn.Module):
    """A GPT-style language model: token + position embeddings, pre-norm blocks, causal mask."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.seq, self.d, self.layers = seq, d, layers
        self.tokens = torch.nn.Embedding(vocab, d)
        self.positions = torch.nn.Embedding(seq, d)
        block = torch.nn.TransformerEncoderLayer(
            d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions.weight[: x.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        logits: torch.Tensor = self.head(self.norm(h))
        return logits

    def flops_per_sample(self) -> float:
        """6 FLOPs per parameter per token, plus attention (nanoGPT's estimate, PaLM appendix B)."""
        embeddings = self.positions.weight.numel() + self.tokens.weight.numel()  # lookups
        n = sum(p.numel() for p in self.parameters()) - embeddings
        return float(6 * n * self.seq + 12 * self.layers * self.d * self.seq * self.seq)


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


class Workload:
    """One benchmark: a model factory, its loss, its batches, its optimizer settings."""

    def __init__(
        self,
        name: str,
        make: Callable[[], torch.nn.Module],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        batches: Batches,
        precision: str = "32",
    ) -> None:
        self.name, self.make, self.loss, self.batches = name, make, loss, batches
        self.precision = precision
        torch.manual_seed(0)
        self.initial = make()  # every contender starts each round from a copy of this

    def model(self, device: torch.device) -> torch.nn.Module:
        return copy.deepcopy(self.initial).to(device)

    def optimizer(self, params: Any, device: torch.device) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-3, fused=device.type == "cuda")

    @property
    def batch_size(self) -> int:
        return int(self.batches[0][0].shape[0])


def mlp_workload(batches: int, device: torch.device) -> Workload:
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(256, 784, generator=g), torch.randint(0, 10, (256,), generator=g))
        for _ in range(batches)
    ]
    return Workload("mlp", mlp, F.cross_entropy, _to(data, device))


def gpt_workload(name: str, batches: int, device: torch.device, **shape: int) -> Workload:
    vocab, seq, batch = shape["vocab"], shape["seq"], shape["batch"]
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(batches):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        data.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    layers = {key: shape[key] for key in ("vocab", "d", "heads", "layers", "seq")}
    precision = "bf16-mixed" if device.type == "cuda" else "32"
    return Workload(name, lambda: GPT(**layers), lm_loss, _to(data, device), precision)


class InMemory:
    """A re-iterable sequence of ready batches, as a loader (what Lightning needs)."""

    def __init__(self, batches: Batches) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _to(batches: Batches, device: torch.device) -> Batches:
    return [(x.to(device), y.to(device)) for x, y in batches]


# --- contenders: each trains `steps` optimizer steps over a TimedBatches ----------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TimedBatches:
    """The batches as a re-iterable loader that notes when chosen batches are fetched.

    Throughput is measured between the fetch of batch ``warm`` and that of batch ``last``: the
    same points for every contender, whatever its set-up, teardown or prefetching (Lightning
    fetches one batch ahead, which shifts both marks equally). The device is synchronised at
    the marks so queued GPU work is counted. ``times[0]`` also gives each fit's set-up cost.
    """

    def __init__(self, batches: Batches, device: torch.device, warm: int, last: int) -> None:
        self.batches, self.device, self.marks = batches, device, (0, warm, last)
        self.times: dict[int, float] = {}
        self.fetched = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.batches:
            if self.fetched in self.marks:
                _sync(self.device)
                self.times[self.fetched] = CLOCK[0]()
            self.fetched += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


Contender = Callable[["Workload", int, torch.device, TimedBatches], None]


def run_raw(w: Workload, steps: int, device: torch.device, data: TimedBatches) -> None:
    """The loop a user would write by hand: no metrics, no checks, no checkpoints."""
    model = w.model(device)
    optimizer = w.optimizer(model.parameters(), device)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=w.precision == "bf16-mixed")
    model.train()
    step = 0
    while step < steps:
        for x, y in data:
            with autocast:
                loss = w.loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == steps:
                break


class _Wrapped(Module):
    def __init__(self, w: Workload, net: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.net, self.w, self.device = net, w, device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return self.w.loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.w.optimizer(self.parameters(), self.device)

    def flops_per_sample(self) -> float | None:
        flops = getattr(self.net, "flops_per_sample", None)
        return float(flops()) if flops else None


class _Logged(_Wrapped):
    """The same step, logging loss and accuracy every step as a LightningModule would."""

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.w.loss(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True)
        return loss


def _logs_dir(name: str) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_trainer_{name}"


def run_trainer(w: Workload, steps: int, device: torch.device, data: TimedBatches) -> None:
    """gpulayer's Trainer with its defaults (metrics every 50 steps), no logger, no checkpoint."""
    module = _Wrapped(w, w.model(device), device)
    precision: Any = w.precision
    config = TrainerConfig(max_steps=steps, precision=precision, checkpoint_at_end=False)
    # The progress lines are produced (that cost is measured) but not shown.
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(config, loggers=[]).fit(module, data)


def run_trainer_with_metrics(
    w: Workload, steps: int, device: torch.device, data: TimedBatches
) -> None:
    """The Trainer with self.log of loss and accuracy every step and a CSVLogger."""
    module = _Logged(w, w.model(device), device)
    precision: Any = w.precision
    config = TrainerConfig(max_steps=steps, precision=precision, checkpoint_at_end=False)
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(config, loggers=[CSVLogger(_logs_dir("gpulayer"))]).fit(module, data)


def lightning_runner(defaults: bool, metrics: bool = False) -> Contender | None:
    """Lightning's Trainer, minimal (no logger, checkpointing, progress bar) or with defaults;
    ``metrics``: self.log of loss and accuracy (prog_bar), its progress bar and a CSVLogger."""
    try:
        import lightning as L
    except ImportError:
        return None
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class LitModule(L.LightningModule):
        def __init__(self, w: Workload, net: torch.nn.Module, device: torch.device) -> None:
            super().__init__()
            self.net, self.w, self.dev = net, w, device

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self.net(x)
            loss = self.w.loss(logits, y)
            if metrics:
                self.log("train_loss", loss, prog_bar=True)
                self.log("train_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True)
            elif defaults:
                self.log("loss", loss, prog_bar=True)  # what a typical LightningModule does
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.w.optimizer(self.parameters(), self.dev)

    def run(w: Workload, steps: int, device: torch.device, data: TimedBatches) -> None:
        module = LitModule(w, w.model(device), device)
        root = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_trainer_lightning"
        options: dict[str, Any] = {"default_root_dir": str(root)}
        if metrics:
            from lightning.pytorch.loggers import CSVLogger as LightningCSV

            options.update(
                logger=LightningCSV(str(_logs_dir("lightning"))),
                enable_checkpointing=False,
                enable_model_summary=False,
            )
        elif not defaults:
            options.update(
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
        precision: Any = "bf16-mixed" if w.precision == "bf16-mixed" else "32-true"
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            trainer = L.Trainer(
                max_steps=steps,
                accelerator="gpu" if device.type == "cuda" else "cpu",
                devices=1,
                precision=precision,
                num_sanity_val_steps=0,
                **options,
            )
            trainer.fit(module, train_dataloaders=data)

    return run


# --- rounds and report ----------------------------------------------------------------------


def measure(
    w: Workload,
    contenders: dict[str, Contender],
    steps: int,
    warm: int,
    rounds: int,
    device: torch.device,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Steady-state samples/s and set-up seconds of every contender in every round.

    One unrecorded warm-up round first; then the order rotates (A B C, B C A, C A B, ...) so
    every contender runs in every position equally often: position in a round matters by a few
    per cent on a shared machine (allocator and cache state left by the previous contender).
    """
    names = list(contenders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    setups: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            data = TimedBatches(w.batches, device, warm, steps - 1)
            _sync(device)
            started = CLOCK[0]()
            contenders[name](w, steps, device, data)
            if round_ > 0:
                seconds = data.times[steps - 1] - data.times[warm]
                rates[name].append((steps - 1 - warm) * w.batch_size / seconds)
                setups[name].append(data.times[0] - started)
    return rates, setups


def report(
    w: Workload,
    measured: tuple[dict[str, list[float]], dict[str, list[float]]],
    flops: float | None = None,
    ratio_of: str = "trainer",
) -> float:
    """Print each contender beside the raw loop; return the median ``ratio_of``/raw ratio."""
    rates, setups = measured
    raw = rates["raw"]
    baseline = statistics.median(raw)
    print(f"{w.name}: raw loop {baseline:,.0f} samples/s (baseline)")
    trainer_ratio = float("nan")
    for name, values in rates.items():
        if name == "raw":
            continue
        ratios = [v / r for v, r in zip(values, raw, strict=True)]
        median = statistics.median(ratios)
        print(
            f"{w.name}: {name} {statistics.median(values):,.0f} samples/s vs raw {baseline:,.0f}:"
            f" {median:.3f}x (per-round {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds)"
        )
        if name == ratio_of:
            trainer_ratio = median
    pairs = (
        ("trainer", "lightning"),
        ("trainer_with_metrics", "lightning_with_metrics"),
        ("trainer_with_metrics", "trainer"),  # what self.log + accuracy + CSV cost the Trainer
    )
    for ours, theirs in pairs:
        if ours in rates and theirs in rates:
            ahead = [t / lt for t, lt in zip(rates[ours], rates[theirs], strict=True)]
            print(
                f"{w.name}: {ours}/{theirs} {statistics.median(ahead):.3f}x "
                f"(per-round {min(ahead):.3f}-{max(ahead):.3f})"
            )
    setup = ", ".join(f"{name} {statistics.median(v) * 1e3:.0f} ms" for name, v in setups.items())
    print(f"{w.name}: set-up until the first batch (not in the figures above): {setup}")
    peak = _peak() if flops else None
    if flops and peak:
        for name in ("raw", "trainer"):
            mfu = flops * statistics.median(rates[name]) / peak
            print(f"{w.name}: {name} MFU {mfu:.1%} (of {peak / 1e12:.0f} TFLOP/s, bf16 dense)")
    return trainer_ratio


def _peak() -> float | None:
    from gpulayer_kernel.torch import peak_flops

    return peak_flops(torch.device("cuda", torch.cuda.current_device()))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--gpu", action="store_true", help="bf16 GPT-style model on CUDA")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per fit")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="what to time")
    parser.add_argument(
        "--mlp-only", action="store_true", help="skip the transformer block (the MLP rows only)"
    )
    parser.add_argument(
        "--fsdp", action="store_true", help="also the FSDP rows (bench_fsdp.py, 2 ranks)"
    )
    args = parser.parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    warnings.filterwarnings("ignore")  # Lightning's advice (workers, log intervals) is noise here
    torch.set_num_threads(args.threads)
    if args.gpu:
        return gpu(args) or fsdp(args)

    device = torch.device("cpu")
    rounds = args.rounds or (2 if args.quick else 12)  # a multiple of 3, 4 and 6 contenders
    steps = args.steps or (12 if args.quick else 60)  # 60: one metrics reduction (step 50) inside
    warm = 2 if args.quick else 5
    print(
        f"torch {torch.__version__}, {args.threads} threads, {rounds} rounds of {steps} steps, "
        f"{args.clock} time from batch {warm} to batch {steps - 1}"
    )
    contenders: dict[str, Contender] = {"raw": run_raw, "trainer": run_trainer}
    lightning = None if args.no_lightning else lightning_runner(defaults=False)
    if lightning is not None:
        contenders["lightning"] = lightning
    elif not args.no_lightning:
        print("lightning: not installed, skipped")

    if not args.mlp_only:
        block = {"vocab": 256, "d": 128, "heads": 4, "layers": 1, "seq": 64, "batch": 32}
        transformer = gpt_workload("transformer", 8, device, **block)
        report(transformer, measure(transformer, contenders, steps, warm, rounds, device))

    mlp_w = mlp_workload(16, device)
    mlp_contenders = dict(contenders)
    mlp_contenders["trainer_with_metrics"] = run_trainer_with_metrics
    if lightning is not None:
        with_metrics = lightning_runner(defaults=False, metrics=True)
        assert with_metrics is not None
        mlp_contenders["lightning_with_metrics"] = with_metrics
    defaults = lightning_runner(defaults=True) if lightning is not None else None
    if defaults is not None and not args.quick:
        mlp_contenders["lightning-defaults"] = defaults
    measured = measure(mlp_w, mlp_contenders, steps, warm, rounds, device)
    ratio = report(mlp_w, measured)
    print(f"trainer/raw (mlp): {ratio:.2f}x")
    rates = measured[0]
    with_metrics_ratio = statistics.median(
        t / r for t, r in zip(rates["trainer_with_metrics"], rates["raw"], strict=True)
    )
    print(f"trainer_with_metrics/raw ratio: {with_metrics_ratio:.3f}")
    return fsdp(args)


def fsdp(args: argparse.Namespace) -> int:
    """``--fsdp``: bench_fsdp.py under torchrun with 2 ranks; its lines as they come."""
    if not args.fsdp:
        return 0
    import subprocess

    here = Path(__file__).resolve().parent
    options = ["--quick"] if args.quick else []
    options += ["--gpu"] if args.gpu else []
    options += ["--rounds", str(args.rounds)] if args.rounds else []
    ranks = min(2, torch.cuda.device_count()) if args.gpu else 2
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    done = subprocess.run(
        [*command, str(here / "bench_fsdp.py"), *options], capture_output=True, text=True
    )
    print(done.stdout, end="")
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode


def gpu(args: argparse.Namespace) -> int:
    """bf16 GPT-style model on one CUDA device: samples/s and MFU, raw loop vs Trainer."""
    if not torch.cuda.is_available():
        print("--gpu skipped: CUDA is not available on this machine")
        return 0
    device = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = True
    rounds = args.rounds or (2 if args.quick else 5)
    steps = args.steps or (12 if args.quick else 60)
    warm = 2 if args.quick else 5
    shape = {"vocab": 32768, "d": 1024, "heads": 16, "layers": 8, "seq": 1024, "batch": 8}
    if args.quick:
        shape.update(layers=2, seq=512)
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, bf16-mixed, "
        f"{rounds} rounds of {steps} steps, GPT {shape}"
    )
    w = gpt_workload("gpt", 4, device, **shape)
    net = w.initial
    flops = net.flops_per_sample() if isinstance(net, GPT) else None
    contenders: dict[str, Contender] = {"raw": run_raw, "trainer": run_trainer}
    ratio = report(w, measure(w, contenders, steps, warm, rounds, device), flops)
    print(f"trainer/raw (gpt): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
