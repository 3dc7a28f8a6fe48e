"""``gpulayer kernelspec install|list|remove``: GPU kernels in JupyterLab's launcher (ADR 0021)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import jobopts
from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add kernelspec and its actions to the ``gpulayer`` sub-parsers."""
    ks = sub.add_parser("kernelspec", help="install, list and remove GPU kernel specs")
    ksub = ks.add_subparsers(dest="kernelspec_command", required=True, metavar="ACTION")
    install = ksub.add_parser("install", help='add "Python 3 (GPUlayer · N GPUs)" to the launcher')
    # --gpus (default 1 here), --gpu-kind, --idle-timeout: the table every edge shares.
    jobopts.add_arguments(install, "kernelspec")
    install.add_argument("--name", default=None, help="the spec's name (default gpulayer-Ngpu)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user only")
    where.add_argument("--sys-prefix", action="store_true", help="into this environment")
    # Not the job option --wait (a switch): how long a starting kernel may queue.
    install.add_argument(
        "--wait",
        type=float,
        default=300.0,
        help="seconds a starting kernel may wait in the queue before it fails (default 300)",
    )
    ksub.add_parser("list", help="list the GPU kernel specs")
    remove = ksub.add_parser("remove", help="remove a GPU kernel spec")
    remove.add_argument("name")


async def cmd_kernelspec(args: argparse.Namespace) -> int:
    from ..kernels import spec

    if args.kernelspec_command == "install":
        prefix = sys.prefix if args.sys_prefix else None
        name, dest = spec.install(
            gpus=args.gpus,
            gpu_kind=[k.lower() for k in args.gpu_kind],
            name=args.name,
            user=args.user,
            prefix=prefix,
            wait=args.wait,
            idle_timeout=args.idle_timeout,
        )
        print(f"{name}\t{spec.display_name(args.gpus, args.gpu_kind)}\t{dest}")
        return 0
    if args.kernelspec_command == "list":
        found = spec.listed()
        if not found:
            print("no GPUlayer kernel specs (add one: gpulayer kernelspec install --gpus 1)")
        for name, s in sorted(found.items()):
            print(f"{name}\t{s['display_name']}\t{s['resource_dir']}")
        return 0
    dest = spec.remove(args.name)
    print(f"removed {args.name} ({dest})")
    return 0


COMMANDS: dict[str, Handler] = {"kernelspec": cmd_kernelspec}
