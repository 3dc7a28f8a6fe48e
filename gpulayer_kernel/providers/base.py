"""The provider protocol (ADR 0010): what every way of getting a machine offers the autoscaler.

    offers()                    the machines it can launch now (``Offer``: capability templates)
    where(offer, instance)      the external id to record *before* launching, where the provider
                                knows one (an SSH host's name); None: its tag finds it
    launch(offer, token, how)   start one whose worker joins with the single-use ``token``;
                                returns the provider's own id for it (a Slurm job id, host:pid)
    terminate(id, external_id)  end it (idempotent: ending an ended machine is no error); a
                                stray (a machine GPUlayer never recorded) is ended by the same
    instances()                 every instance it runs that GPUlayer tagged (``Census``)
    check()                     one line for ``gpulayer providers``: reachable, and why not

Providers never decide anything: the pure ``autoscale.plan_scaling`` decides, the control plane's
autoscaler calls them (with timeouts) and records every launch before it is made. A provider
tags each machine with its ``owner`` tag, the cluster id (``cluster.py``: the same for every
server leading one database), and the GPUlayer instance id (``gpulayer-<owner>-<instance>``: a
Slurm job name, a directory on a host), so ``instances()`` names exactly this cluster's
machines (whichever server launched them), and among them the ones it does not know, to end.

The worker a provider starts is a real ``gpulayer worker`` (``worker_argv``): the token travels
in its environment (``GPULAYER_JOIN_TOKEN``), never on a command line that ``ps`` shows.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ..contracts import Offer

TOKEN_ENV = "GPULAYER_JOIN_TOKEN"

ReportedState = Literal["booting", "running", "ended", "preempted", "failed"]


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How the worker on a new machine must start: its name, the server, its limits."""

    instance_id: str
    worker_name: str
    server_url: str  # every control-plane URL, comma-separated: the worker follows a failover
    max_seconds: float | None = None  # the machine's time limit, when the offer has one
    ca_cert: str | None = None  # what the worker trusts for an https server


@dataclass(frozen=True, slots=True)
class Reported:
    """One machine as its provider reports it."""

    external_id: str  # "" while the machine is starting and has no id of its own yet
    instance_id: str | None  # from the provider's tag; None: not one of GPUlayer's names
    state: ReportedState
    detail: str = ""  # e.g. the Slurm job state and reason
    charge: float | None = None  # dollars the provider bills for it, where it says


@dataclass(frozen=True, slots=True)
class Census:
    """What ``instances()`` found: the machines, and the offers whose machines could not be
    listed this time (an unreachable host): those instances are neither found nor missing."""

    reported: tuple[Reported, ...] = ()
    unlisted: frozenset[str] = frozenset()  # offer ids
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    detail: str
    offers: tuple[Offer, ...] = field(default=())


@runtime_checkable
class Provider(Protocol):
    """A way of getting machines; every call may raise ``ProviderError`` (or hang: the
    autoscaler bounds each call with a timeout)."""

    name: str
    kind: str
    max_instances: int

    async def offers(self) -> list[Offer]: ...

    def where(self, offer: Offer, instance_id: str) -> str | None: ...

    async def launch(self, offer: Offer, instance_token: str, how: LaunchSpec) -> str: ...

    async def terminate(self, instance_id: str, external_id: str | None) -> None: ...

    async def instances(self) -> Census: ...

    async def check(self) -> Check: ...

    async def close(self) -> None: ...


def worker_argv(
    gpulayer: list[str], offer: Offer, how: LaunchSpec, *, work_dir: str | None = None
) -> list[str]:
    """The ``gpulayer worker`` command line for a machine launched from ``offer``."""
    argv = [*gpulayer, "worker", "--server", how.server_url, "--name", how.worker_name]
    labels = {**offer.labels, "gpulayer.instance": how.instance_id, "gpulayer.offer": offer.id}
    argv += ["--labels", ",".join(f"{k}={v}" for k, v in sorted(labels.items()))]
    if offer.simulated and offer.gpus:
        kind = offer.gpu_kind or "sim"
        if offer.gpu_memory:
            kind += f"-{offer.gpu_memory >> 30}gb"
        argv += ["--simulate-gpus", str(offer.gpus), "--simulate-kind", kind]
    if work_dir:
        argv += ["--work-dir", work_dir]
    if how.ca_cert:
        argv += ["--ca-cert", how.ca_cert]
    return argv


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
