"""How a job reaches the control plane that placed it (ADR 0022).

A served control plane gives each assignment a token scoped to its job, among its resolved
secrets (``GPULAYER_TOKEN``: it reaches the job's environment as secrets do, and is redacted from
its logs like one). The worker adds ``GPULAYER_URL`` (every URL it knows of the control plane,
for failover): ``Client()``, the CLI and ``%%gpulayer`` inside find them first
(``client.connect``), so the ranks of a 2-GPU job no longer each open an embedded control plane
in ``~/.gpulayer`` and race for its lock. An in-process worker's jobs find their control plane
through ``$GPULAYER_HOME`` as before.
"""

from __future__ import annotations

from typing import Any

from ..contracts import JobAssignment
from .transport import AttemptTransport, Transport

# As ``client.connect`` reads them (named here: the worker does not import the client side).
URL_ENV = "GPULAYER_URL"
TOKEN_ENV = "GPULAYER_TOKEN"


def scoped_env(transport: Transport, assignment: JobAssignment) -> dict[str, str]:
    """``GPULAYER_URL`` for a job whose assignment brought its token (else nothing)."""
    inner: Any = transport.inner if isinstance(transport, AttemptTransport) else transport
    servers = getattr(inner, "servers", None)
    if TOKEN_ENV not in assignment.secrets or servers is None:
        return {}
    return {URL_ENV: ",".join(servers.urls)}
