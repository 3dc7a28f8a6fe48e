"""The environment that lets a job reach the control plane that placed it (ADR 0022).

An HTTP worker asks for a token scoped to the job (``POST /worker/jobs/{id}/token``) and hands
it to the job as ``GPULAYER_TOKEN``, with ``GPULAYER_URL`` (every URL it knows of the control
plane, for failover): ``Client()``, the CLI and ``%%gpulayer`` inside find it first
(``client.connect``), so the ranks of a 2-GPU job no longer each open an embedded control plane
in ``~/.gpulayer`` and race for its lock. An in-process worker's jobs find their control plane
through ``$GPULAYER_HOME`` as before. A token that cannot be had never stops the job: it runs
without, and its log says so.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import GPUlayerError
from .transport import AttemptTransport, InProcessTransport, Transport

log = logging.getLogger("gpulayer.worker")
# As ``client.connect`` reads them (named here: the worker does not import the client side).
URL_ENV = "GPULAYER_URL"
TOKEN_ENV = "GPULAYER_TOKEN"


async def scoped_env(transport: Transport, job_id: str) -> tuple[dict[str, str], str | None]:
    """``GPULAYER_URL`` and a job token for ``job_id`` (empty for an in-process worker), and
    a note when it could not be had."""
    inner: Any = transport.inner if isinstance(transport, AttemptTransport) else transport
    if isinstance(inner, InProcessTransport) or not hasattr(inner, "servers"):
        return {}, None
    try:
        resp = await inner._request("POST", f"/worker/jobs/{job_id}/token")
    except GPUlayerError as exc:
        return {}, f"no job token ({exc.message}): GPUlayer calls inside the job need their own"
    token = str(resp.json()["token"])
    return {URL_ENV: ",".join(inner.servers.urls), TOKEN_ENV: token}, None
