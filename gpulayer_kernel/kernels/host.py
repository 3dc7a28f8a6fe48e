"""One background event loop per process for the GPU kernels' relays and their control plane.

The Jupyter server (or a test's ``KernelManager``) runs provisioners on its own loop; the relays
and their link run here, on a daemon thread, so that a slow control plane never stalls the
server's loop and the embedded control plane (when no served one is found) lives in one place
for every kernel of the process. The control plane is found as the magics find it
(``client.connect.find_remote``): ``GPULAYER_URL``, else the live owner of ``$GPULAYER_HOME``,
else an embedded one opened here, with a local worker, serving the API on loopback so that other
processes (the CLI, the panel's server) reach it.

When the control plane found is this very process's (``gpulayer lab``: the Jupyter server
extension hosts it, and publishes its address for the kernels), the link calls it directly on its
loop (:func:`local_plane`): one thread hop per call instead of an HTTP request through loopback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .link import CpLink, HostLink, HttpLink

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..security.roles import Identity

T = TypeVar("T")

# The control planes this process hosts, by the URL it published for its kernels.
_LOCAL: dict[str, tuple[ControlPlane, asyncio.AbstractEventLoop, Identity]] = {}


def local_plane(url: str, cp: ControlPlane | None, who: Identity | None = None) -> None:
    """Publish (``cp``) or withdraw (None) a control plane this process serves at ``url``, run
    on the calling loop; kernels reaching ``url`` call it in-process, acting as ``who``."""
    key = url.rstrip("/")
    if cp is None:
        _LOCAL.pop(key, None)
        return
    from ..security.roles import Identity, Role

    _LOCAL[key] = (cp, asyncio.get_running_loop(), who or Identity("admin", Role.ADMIN))


class Host:
    """The loop thread and the link it opened (on first use)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="gpulayer-kernels", daemon=True
        )
        self._thread.start()
        self._link: HostLink | None = None
        self._embedded: Any = None
        self._opening: asyncio.Lock | None = None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the host loop and await it from another loop."""
        return await asyncio.wrap_future(self.submit(coro))

    async def link(self) -> HostLink:
        """(On the host loop.) The control plane's link, found or opened once."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._link is None:
                self._link = await self._open()
            return self._link

    async def _open(self) -> HostLink:
        from ..client.connect import find_remote

        remote = find_remote()
        if remote is not None:
            here = _LOCAL.get(remote[0].rstrip("/"))
            if here is not None:
                cp, loop, who = here
                return CpLink(cp, who, loop=loop)
            return HttpLink(*remote)
        from ..embedded import Embedded, ServeOptions

        emb = Embedded(local_worker=True, serve=ServeOptions(soon=True))
        await emb.start()
        self._embedded = emb
        return CpLink(emb.cp)

    async def close(self) -> None:
        """(On the host loop.) Close the link and an embedded control plane."""
        if self._link is not None:
            await self._link.close()
            self._link = None
        if self._embedded is not None:
            await self._embedded.stop()
            self._embedded = None


_HOST: Host | None = None
_LOCK = threading.Lock()


def host() -> Host:
    """The process's host (started on first use)."""
    global _HOST
    with _LOCK:
        if _HOST is None:
            _HOST = Host()
        return _HOST


def use_link(link: HostLink) -> Host:
    """Make ``link`` the host's link (tests and benchmarks hand in a control plane of their own;
    call from outside the host loop before the first kernel starts)."""
    h = host()
    h._link = link
    return h
