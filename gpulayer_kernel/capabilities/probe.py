"""The capability probe as a program: ``python -m gpulayer_kernel.capabilities.probe``.

It prints one line of ``WorkerCapabilities`` JSON on stdout and exits 0, always: every step that
fails (torch import, NVML, nvidia-smi) is a line in ``probe_errors`` (see ``readers.py``). The
worker runs it in a subprocess with a timeout through ``run_probe``, so a hang or a crash costs a
reason, not the worker. ``--simulate-gpus N --simulate-kind KIND`` replaces the devices with
simulated ones.

As the background check (``local.py``) it also keeps its answer in the per-machine cache
(``--cache-dir DIR --key KEY``, written before it prints, so the answer is kept even when whoever
started it is gone) and stops itself after ``--deadline`` seconds: nobody may be left to kill it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ..contracts import WorkerCapabilities
from .readers import IMPORT, probe
from .simulated import simulated_capabilities


def main(argv: Sequence[str] | None = None) -> int:
    """Print this machine's capabilities as one line of JSON; exit 0 whatever happens."""
    parser = argparse.ArgumentParser(
        prog="python -m gpulayer_kernel.capabilities.probe",
        description="Print this machine's GPU capabilities as WorkerCapabilities JSON.",
    )
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--simulate-kind", default="a100-80gb", metavar="KIND")
    parser.add_argument("--no-torch", action="store_true", help="do not import torch")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep the answer here")
    parser.add_argument("--key", default=None, help="the per-machine cache key to keep it under")
    parser.add_argument(
        "--deadline", type=int, default=0, metavar="S", help="stop after S seconds (0: never)"
    )
    args = parser.parse_args(argv)
    if args.deadline > 0 and hasattr(signal, "alarm"):
        signal.alarm(args.deadline)  # SIGALRM's default action ends a hung torch import
    try:
        caps = probe(torch=None if args.no_torch else IMPORT)
        if args.simulate_gpus > 0:
            caps = simulated_capabilities(args.simulate_gpus, args.simulate_kind, base=caps)
    except BaseException as exc:  # never crash: report the failure as data
        caps = WorkerCapabilities(probe_errors=[f"probe: {type(exc).__name__}: {exc}"])
    if args.cache_dir is not None and args.key and not _failed(caps):
        from .machine import MachineCache

        MachineCache(args.cache_dir).write(args.key, caps.model_dump(mode="json"))
    try:
        sys.stdout.write(caps.model_dump_json() + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # whoever asked is gone; the cache has the answer
    return 0


def _failed(caps: WorkerCapabilities) -> bool:
    return any(e.startswith("probe:") for e in caps.probe_errors)


if __name__ == "__main__":
    raise SystemExit(main())
