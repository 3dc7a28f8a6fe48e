"""The capability probe as a program: ``python -m gpulayer_kernel.capabilities.probe``.

It prints one line of ``WorkerCapabilities`` JSON on stdout and exits 0, always: every step that
fails (torch import, NVML, nvidia-smi) is a line in ``probe_errors`` (see ``readers.py``). The
worker runs it in a subprocess with a timeout through ``run_probe``, so a hang or a crash costs a
reason, not the worker. ``--simulate-gpus N --simulate-kind KIND`` replaces the devices with
simulated ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
    args = parser.parse_args(argv)
    try:
        caps = probe(torch=None if args.no_torch else IMPORT)
        if args.simulate_gpus > 0:
            caps = simulated_capabilities(args.simulate_gpus, args.simulate_kind, base=caps)
    except BaseException as exc:  # never crash: report the failure as data
        caps = WorkerCapabilities(probe_errors=[f"probe: {type(exc).__name__}: {exc}"])
    sys.stdout.write(caps.model_dump_json() + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
