"""What a ``%%gpulayer`` cell costs: a trivial cell vs a bare process, and log-line latency.

    .venv/bin/python benchmarks/bench_cell.py [--rounds N] [--quick]

Starts a real ipykernel (isolated ``GPULAYER_HOME``, Jupyter and IPython folders in tmp) with the
extension loaded, so the embedded control plane and its local worker live in the kernel, as in a
notebook opened without the GPUlayer server. Then, in one run:

1. paired, interleaved rounds (after a warm-up) of
   * cell: execute ``%%gpulayer --out x`` / ``1 + 1`` in the kernel, from the execute request to
     its reply (the result is in ``x`` by then);
   * bare: ``python -c "1 + 1"`` in a fresh process, from spawn to exit;
   * px: ipyparallel's ``%%px --block`` / ``1 + 1`` on one engine started by the same kernel
     (the anchor of issue 14; skipped with ``--no-anchors``, ``--quick`` or without ipyparallel);
   * torch cell: ``%%gpulayer --out y`` of a cell that uses torch (where torch is installed:
     the worker's warm processes have it imported, ``GPULAYER_ZYGOTE_PRELOAD``'s default);
2. a job printing ``time.time()`` on lines 50 ms apart; each line's latency is the time the
   notebook client (this process) received it over iopub minus the time the worker printed it
   (same machine clock). That is the kernel receiving it plus one iopub hop.

Beside each wall time, the CPU per cell (``_cpu.py``, read from ``/proc``): this process (the
notebook client), the kernel's own, and the trees of the way measured (the worker's zygotes with
their spares and jobs, or ipyparallel's controller and engine), read through 0.15 s after the
cell so that the spare a job used is replaced inside its window.

The last line is the median of the per-round cell/px ratios, e.g. ``cell/ipyparallel: 0.90x``
(``cell/bare: 2.10x`` without the anchor). Targets: cell <= 1.0x ``%%px --block``; cell <= 1.5x
bare; a torch cell <= 15 ms; log line p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _cpu import BlockCpu, children_of  # benchmarks/_cpu.py (scripts run from benchmarks/)
from _machine import describe

TRIVIAL = "%%gpulayer --out x\n1 + 1\n"
SETTLE = 0.15  # s after a cell before its CPU is read: the worker replaces a spare 0.1 s after use
TORCH = "%%gpulayer --out y\nimport torch\nfloat(torch.ones(4).sum())\n"
PX = "%%px --block\n1 + 1\n"
PX_START = (
    "import ipyparallel as ipp\n"
    "rc = ipp.Cluster(n=1, log_level=40).start_and_connect_sync()\n"
    "rc.wait_for_engines(1)\nrc[:].activate()\n"
)
LOG_CELL = """%%gpulayer --out n
import time
for i in range({lines}):
    print(f"t={{time.time():.6f}}", flush=True)
    time.sleep(0.05)
{lines}
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Kernel:
    def __init__(self, root: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "GPULAYER_URL",
                "GPULAYER_TOKEN",
                "GPULAYER_SIMULATE_GPUS",
                "JPY_SESSION_NAME",
                "GPULAYER_DISPLAY",
            )
        }
        for name in (
            "GPULAYER_HOME",
            "JUPYTER_CONFIG_DIR",
            "JUPYTER_DATA_DIR",
            "JUPYTER_RUNTIME_DIR",
            "IPYTHONDIR",
        ):
            (root / name).mkdir()
            env[name] = str(root / name)
        os.environ["JUPYTER_RUNTIME_DIR"] = env["JUPYTER_RUNTIME_DIR"]
        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))

    def run(self, code: str, timeout: float = 120.0) -> tuple[dict[str, Any], list[Any]]:
        """Execute; return the reply and the stream messages, each with its arrival time."""
        msg_id = self.kc.execute(code, allow_stdin=False)
        streams: list[Any] = []
        deadline = time.monotonic() + timeout
        idle = False
        while not idle:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            arrived = time.time()
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                streams.append((arrived, msg["content"]["text"]))
            idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                if reply["content"]["status"] != "ok":
                    raise RuntimeError(f"cell failed: {reply['content']}\n{streams}")
                return reply, streams

    def timed(self, code: str) -> float:
        """Seconds from the execute request to its reply."""
        msg_id = self.kc.execute(code, allow_stdin=False)
        start = time.perf_counter()
        while True:
            reply = self.kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg_id:
                took = time.perf_counter() - start
                if reply["content"]["status"] != "ok":
                    raise RuntimeError(f"cell failed: {reply['content']}")
                return took

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        self.km.cleanup_resources()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def bare() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "1 + 1"], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--lines", type=int, default=60, help="log lines for the latency test")
    p.add_argument(
        "--quick", action="store_true", help="a smoke test: few rounds and lines, no anchors"
    )
    p.add_argument("--no-anchors", action="store_true", help="skip ipyparallel")
    args = p.parse_args(argv)
    # --quick checks the script, not the figures: no ipyparallel cluster (seconds of start-up).
    anchors = not (args.no_anchors or args.quick) and _installed("ipyparallel")
    torch = _installed("torch")
    warm = 3
    if args.quick:
        args.rounds, args.lines, warm = 2, 10, 1  # 2 rounds: both orders of the interleaving
    root = Path(tempfile.mkdtemp(prefix="gpulayer-bench-cell-"))
    kernel = Kernel(root)
    try:
        started = time.perf_counter()
        kernel.run("%load_ext gpulayer_kernel.jupyter")
        first = kernel.timed(TRIVIAL)  # opens the control plane (probe) and runs a cell
        print(f"machine: {describe()}")
        print(
            f"first cell after kernel start: {1000 * first:.0f} ms "
            f"(extension load + control plane + worker probe + job); "
            f"{1000 * (time.perf_counter() - started):.0f} ms in all"
        )
        kernel_pid = kernel.km.provisioner.pid
        ours = {f"gl{i}": p for i, p in enumerate(children_of(kernel_pid))}  # its zygotes
        if anchors:
            kernel.run(PX_START)
        theirs = {f"ipp{i}": p for i, p in enumerate(children_of(kernel_pid) - set(ours.values()))}
        cpu = BlockCpu()

        def measured(name: str, code: str, roots: dict[str, int]) -> Callable[[], float]:
            """Wall time of one cell; its CPU (this process, the kernel's own and ``roots``'
            trees) read around it, through the spare it used being replaced (0.1 s later)."""

            def run() -> float:
                at = cpu.before(roots, alone=[kernel_pid])
                took = kernel.timed(code)
                time.sleep(SETTLE)
                cpu.after(name, roots, at, alone=[kernel_pid])
                return took

            return run

        runs: dict[str, Callable[[], float]] = {
            "cell": measured("cell", TRIVIAL, ours),
            "bare": bare,
        }
        if anchors:
            runs["px"] = measured("px", PX, theirs)
        if torch:
            runs["torch"] = measured("torch", TORCH, ours)
        for _ in range(warm):  # warm-up: page cache, imports, sqlite, the engine
            for run in runs.values():
                run()
        got: dict[str, list[float]] = {name: [] for name in runs}
        ratios, px_ratios = [], []
        for i in range(args.rounds):
            # Alternate the order, so no one always gets the warmer moment.
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            this = {name: runs[name]() for name in order}
            for name, value in this.items():
                got[name].append(value)
            ratios.append(this["cell"] / this["bare"])
            if anchors:
                px_ratios.append(this["cell"] / this["px"])
        cells, bares = got["cell"], got["bare"]
        _, check = kernel.run("print(x)")
        # print's text and its newline may arrive as two stream messages: join them.
        assert "".join(text for _, text in check).strip() == "2", check
        _, streams = kernel.run(LOG_CELL.format(lines=args.lines))
        lat = [
            arrived - float(line[2:])
            for arrived, text in streams
            for line in text.splitlines()
            if line.startswith("t=")
        ]
        assert len(lat) == args.lines, f"got {len(lat)} of {args.lines} lines"
        ms = [1000 * v for v in lat]
        print(
            f"cell (%%gpulayer --out x: 1 + 1): p50 {1000 * statistics.median(cells):.1f} ms, "
            f"p95 {1000 * pct(cells, 0.95):.1f} ms ({args.rounds} rounds), "
            f"{cpu.per_call_ms('cell'):.2f} ms CPU (client + kernel + its worker's processes; "
            f"{SETTLE * 1000:.0f} ms of idle kernel included)"
        )
        print(
            f'bare (python -c "1 + 1"):          p50 {1000 * statistics.median(bares):.1f} ms, '
            f"p95 {1000 * pct(bares, 0.95):.1f} ms"
        )
        print(
            f"log line, worker print -> notebook client: p50 {statistics.median(ms):.1f} ms, "
            f"p95 {pct(ms, 0.95):.1f} ms, max {max(ms):.1f} ms ({len(ms)} lines)"
        )
        if torch:
            t = 1000 * statistics.median(got["torch"])
            print(
                f"torch cell (%%gpulayer, import torch): p50 {t:.1f} ms, "
                f"p95 {1000 * pct(got['torch'], 0.95):.1f} ms, "
                f"{cpu.per_call_ms('torch'):.2f} ms CPU "
                f"(target <= 15 ms: {'met' if t <= 15 else 'MISSED'})"
            )
        if anchors:
            print(
                f"ipyparallel %%px --block, 1 engine: p50 {1000 * statistics.median(got['px']):.1f}"
                f" ms, p95 {1000 * pct(got['px'], 0.95):.1f} ms, "
                f"{cpu.per_call_ms('px'):.2f} ms CPU (client + kernel + its controller and engine)"
            )
            print(
                f"CPU per cell, %%gpulayer / %%px: "
                f"{cpu.per_call_ms('cell') / max(cpu.per_call_ms('px'), 1e-9):.2f}x"
            )
        ratio = statistics.median(ratios)
        print(
            f"per-round cell/bare ratios: p5 {pct(ratios, 0.05):.2f}x, p95 {pct(ratios, 0.95):.2f}x"
        )
        print(
            f"targets: cell <= 1.5x bare {'met' if ratio <= 1.5 else 'MISSED'}; "
            f"log p50 <= 50 ms {'met' if statistics.median(ms) <= 50 else 'MISSED'}"
        )
        if anchors:
            px_ratio = statistics.median(px_ratios)
            print(
                f"per-round cell/px ratios: p5 {pct(px_ratios, 0.05):.2f}x, "
                f"p95 {pct(px_ratios, 0.95):.2f}x "
                f"(target <= 1.0x: {'met' if px_ratio <= 1.0 else 'MISSED'})"
            )
            print(f"cell/ipyparallel: {px_ratio:.2f}x")
        else:
            print(f"cell/bare: {ratio:.2f}x")
    finally:
        if anchors:  # the engine and controller are processes of their own: stop them first
            with contextlib.suppress(Exception):
                kernel.run("rc.cluster.stop_cluster_sync()", timeout=60)
        kernel.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
