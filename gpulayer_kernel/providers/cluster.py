"""Whose machines these are: the cluster id in the store, and the providers config its leader runs.

Every machine GPUlayer launches carries an owner tag (``gpulayer-<owner>-<instance>``: a Slurm
job name, a directory on a host), and a control plane lists, adopts and ends exactly the
machines tagged with its own. The tag is the **cluster id**, made once and stored in the
database (store migration 7), so every server that leads that database (an active and its
standbys, ADR 0010) owns the same machines: after a failover the new leader finds the old
leader's machines running instead of calling them gone.

A database that already has instances when its id is first made (an upgrade from the tag of
one server's host and home) keeps that tag, so the machines of the upgraded server stay found.

The providers config is compared, not enforced: a leader records the config it runs, and a
server that leads (or stands by) with another one logs what differs. Refusing would turn a
rolling edit of ``providers.toml`` (one server, then the other) into an outage; the instances
of a provider the new leader lacks are left as they are, never failed (``autoscale.reconcile``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import socket
from pathlib import Path
from typing import Any

from ..store import MetadataStore
from .config import ProvidersConfig

log = logging.getLogger("gpulayer.providers")
CLUSTER_ID = "cluster_id"
PROVIDERS = "providers_config"
SHOWN = 8  # differences named in one warning


def legacy_tag(home: Path) -> str:
    """The owner tag of servers before the cluster id: six hex digits of host and home."""
    key = f"{socket.gethostname()}:{home.resolve()}"
    return hashlib.sha256(key.encode()).hexdigest()[:6]


async def cluster_id(store: MetadataStore, home: Path) -> str:
    """This database's cluster id, made by the first server that asks (see the module doc)."""
    known = await store.get_cluster_value(CLUSTER_ID)
    if known is not None:
        return known
    upgraded = bool(await store.load_instances(ended=True, limit=1))
    made = legacy_tag(home) if upgraded else secrets.token_hex(6)
    return await store.claim_cluster_value(CLUSTER_ID, made)


def canonical(config: ProvidersConfig) -> dict[str, Any]:
    """The config as data, without where it was read from (two servers' paths may differ)."""
    return config.model_dump(mode="json", exclude={"path"})


def differences(ours: Any, theirs: Any, at: str = "") -> list[str]:
    """``field: X here, Y on the leader`` for every field that differs, dotted paths."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out: list[str] = []
        for key in sorted(set(ours) | set(theirs)):
            where = f"{at}.{key}" if at else str(key)
            if key not in theirs:
                out.append(f"{where}: set here, absent on the leader")
            elif key not in ours:
                out.append(f"{where}: absent here, set on the leader")
            else:
                out += differences(ours[key], theirs[key], where)
        return out
    if ours != theirs:
        return [f"{at or 'providers.toml'}: {ours!r} here, {theirs!r} on the leader"]
    return []


async def compare_providers(
    store: MetadataStore, config: ProvidersConfig | None, *, record: bool
) -> list[str]:
    """What differs between ``config`` (None: no providers.toml) and the one the last leader
    recorded, logged as a warning; ``record``: this server leads now, its config is recorded."""
    ours = canonical(config) if config is not None else {}
    stored = await store.get_cluster_value(PROVIDERS)
    diff = [] if stored is None else differences(ours, json.loads(stored))
    if diff:
        more = f" (and {len(diff) - SHOWN} more)" if len(diff) > SHOWN else ""
        log.warning(
            "this server's providers.toml differs from the one the cluster's leader ran: %s%s; "
            "give every server of the cluster the same file (instances of a provider this "
            "server lacks are left as they are)",
            "; ".join(diff[:SHOWN]),
            more,
        )
    text = json.dumps(ours, sort_keys=True)
    if record and text != stored and (config is not None or stored is not None):
        await store.set_cluster_value(PROVIDERS, text)
    return diff
