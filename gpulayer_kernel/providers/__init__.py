"""Providers (ADR 0010): ways of getting machines whose workers join this control plane.

- ``base``: the ``Provider`` protocol, ``LaunchSpec``, ``Reported``/``Census``, ``worker_argv``
- ``config``: ``$GPULAYER_HOME/providers.toml``, validated (``ConfigInvalid`` names the field)
- ``fake``: ``FakeProvider``, a simulated cloud of real ``gpulayer worker`` processes
- ``slurm``: ``SlurmProvider``, workers as batch jobs (sbatch, squeue --json, scancel)
- ``sshfleet``: ``SSHFleetProvider``, workers on hosts listed in the config, over asyncssh

``build(config, ...)`` makes one provider per ``[providers.NAME]`` table.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from .base import Census, Check, LaunchSpec, Provider, Reported, worker_argv
from .config import ProvidersConfig, config_path, load, parse_config
from .fake import FakeProvider
from .slurm import SlurmProvider
from .sshfleet import SSHFleetProvider

__all__ = [
    "Census",
    "Check",
    "FakeProvider",
    "LaunchSpec",
    "Provider",
    "ProvidersConfig",
    "Reported",
    "SSHFleetProvider",
    "SlurmProvider",
    "build",
    "config_path",
    "load",
    "owner_tag",
    "parse_config",
    "worker_argv",
]


def owner_tag(home: Path) -> str:
    """Six hex digits naming this control plane on a shared cluster: its host and state dir.
    Machines tagged with another control plane's are never touched by this one."""
    key = f"{socket.gethostname()}:{home.resolve()}"
    return hashlib.sha256(key.encode()).hexdigest()[:6]


def build(
    config: ProvidersConfig, *, home: Path, clock: Clock = SYSTEM_CLOCK
) -> dict[str, Provider]:
    """One provider per configured table, in name order."""
    owner = owner_tag(home)
    timeout = config.autoscale.launch_timeout
    out: dict[str, Provider] = {}
    for name, s in sorted(config.providers.items()):
        if s.kind == "fake":
            out[name] = FakeProvider(s, clock=clock, home=home / "providers")
        elif s.kind == "slurm":
            out[name] = SlurmProvider(s, owner=owner, timeout=timeout)
        else:
            out[name] = SSHFleetProvider(s, owner=owner, timeout=timeout)
    return out
