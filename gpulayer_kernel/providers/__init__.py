"""Providers (ADR 0010): ways of getting machines whose workers join this control plane.

- ``base``: the ``Provider`` protocol, ``LaunchSpec``, ``Reported``/``Census``, ``worker_argv``
- ``config``: ``$GPULAYER_HOME/providers.toml``, validated (``ConfigInvalid`` names the field)
- ``fake``: ``FakeProvider``, a simulated cloud of real ``gpulayer worker`` processes
- ``slurm``: ``SlurmProvider``, workers as batch jobs (sbatch, squeue --json, scancel)
- ``sshfleet``: ``SSHFleetProvider``, workers on hosts listed in the config, over asyncssh
- ``cluster``: the cluster id (the owner tag of every machine) and the providers config compared

``build(config, owner=...)`` makes one provider per ``[providers.NAME]`` table.
"""

from __future__ import annotations

from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from .base import Census, Check, LaunchSpec, Provider, Reported, worker_argv
from .cluster import cluster_id, compare_providers, legacy_tag
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
    "cluster_id",
    "compare_providers",
    "config_path",
    "load",
    "owner_tag",
    "parse_config",
    "worker_argv",
]


owner_tag = legacy_tag  # the name before the cluster id; kept for callers


def build(
    config: ProvidersConfig, *, home: Path, owner: str | None = None, clock: Clock = SYSTEM_CLOCK
) -> dict[str, Provider]:
    """One provider per configured table, in name order. ``owner``: the tag of this cluster's
    machines (``cluster.cluster_id``; default: the legacy tag of this host and home)."""
    owner = owner or legacy_tag(home)
    timeout = config.autoscale.launch_timeout
    out: dict[str, Provider] = {}
    for name, s in sorted(config.providers.items()):
        if s.kind == "fake":
            state = Path(s.state_dir) if s.state_dir else home / "providers"
            out[name] = FakeProvider(s, clock=clock, home=state)
        elif s.kind == "slurm":
            out[name] = SlurmProvider(s, owner=owner, timeout=timeout)
        else:
            out[name] = SSHFleetProvider(s, owner=owner, timeout=timeout)
    return out
