"""The GPU kernel provisioner (ADR 0021): jupyter_client's extension point, placing the kernel.

``GPUlayerProvisioner`` is registered as the ``gpulayer-provisioner`` entry point of
``jupyter_client.kernel_provisioners``; a kernel spec made by ``gpulayer kernelspec install``
names it with its config (``gpus``, ``gpu_kind``, ``wait``, ``idle_timeout``). On launch it
starts the kernel's session through the control plane (found as the magics find it), waits up to
``wait`` seconds for it to be placed, logging the queue's sentence each time it changes, and
binds the connection file's ports here with a :class:`~.relay.LocalRelay`. Jupyter then talks to
those ports as to any local kernel.

Its life as jupyter_client sees it: ``poll`` is None while the session lives and the kernel
process has not exited; ``send_signal(SIGINT)`` is the session's interrupt; a restart keeps the
session (and its GPUs) and starts a new kernel process on them; ``cleanup`` without restart,
``terminate`` and ``kill`` stop the session, which frees its GPUs.

A session that ends on purpose (its idle timeout, a stop from the panel or the CLI: the relay's
``final``) does not make the kernel dead: ``poll`` stays None, so jupyter_client's restarter
never starts a new session behind the user's back, and the relay answers each cell with the
reason. The user's restart is the reconnect: it starts a new session. A session that *died* (a
lost worker) is a dead kernel, which the restarter starts again as before.

A start fails at once when waiting cannot help (the scheduler's report says no worker here can
ever run it: ``never_fits``), else after ``wait`` seconds; its error carries the queue's sentence
as jupyter_server's answer (``POST /api/kernels``, Lab's "Error Starting Kernel" dialog).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from tornado.web import HTTPError
from traitlets import Float

from .. import jobopts
from ..contracts import JobState, PlacementReport, SessionHolder, SessionInfo
from ..contracts.kernels import KernelConnection, KernelStart
from ..contracts.workspace import WorkspaceSource
from ..errors import GPUlayerError
from .host import Host, host
from .relay import BIND, LocalRelay, Ports

DEFAULT_WAIT = 300.0  # seconds a kernel may wait in the queue before its start fails


class KernelStartFailed(HTTPError, RuntimeError):
    """The kernel's session could not be placed (in time, or ever): the message says why.

    A tornado ``HTTPError`` so that jupyter_server answers a failed ``POST /api/kernels`` with
    this sentence (503) rather than "Unhandled error"; a ``RuntimeError`` for other callers."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message.replace("%", "%%"), reason="No GPU for this kernel")
        self.message = message

    def __str__(self) -> str:
        return self.message


class GPUlayerProvisioner(KernelProvisionerBase):
    """Places the kernel on a GPUlayer worker as a session and relays its messages."""

    # The kernel spec's config: ``kernelspec install``'s job options, from the table every edge
    # shares (tests/test_jobopts.py checks each kernelspec option is here).
    gpus = jobopts.trait("--gpus", "kernelspec")
    gpu_kind = jobopts.trait("--gpu-kind", "kernelspec")
    idle_timeout = jobopts.trait("--idle-timeout", "kernelspec")  # None: the contract's default
    # Not a job option (the job option --wait is a switch): how long a start may queue.
    max_wait = Float(DEFAULT_WAIT, help="seconds to wait in the queue before failing").tag(
        config=True
    )

    session_id: str | None = None
    relay: LocalRelay | None = None
    ports: Ports | None = None  # bound before the connection file is written, held till cleanup
    _key: str = ""
    _scheme: str = "hmac-sha256"
    _terminated: int | None = None
    _notebook: str | None = None
    _folder: str | None = None  # the notebook's folder: where the kernel runs (ADR 0022)
    _workspace: Any = None

    @property
    def has_process(self) -> bool:
        return self.session_id is not None

    @property
    def _host(self) -> Host:
        return host()

    # -- launching ---------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        assert km is not None, "a provisioner runs under a KernelManager"
        kwargs.pop("extra_arguments", None)
        # jupyter_server names the notebook in the kernel's environment, not in its own: the
        # sidebar's "held by" and its Notebook button read it from the session's holder.
        env = kwargs.get("env") or {}
        self._notebook = env.get("JPY_SESSION_NAME") or os.environ.get("JPY_SESSION_NAME") or None
        # jupyter_server starts a kernel in its notebook's folder (``cwd``): the workspace.
        cwd = kwargs.get("cwd")
        self._folder = os.path.abspath(cwd) if cwd and os.path.isdir(cwd) else None
        # Ports on this host, bound now (a port picked free and bound once the session is
        # placed could be taken meanwhile), and the key the kernel on the worker will sign
        # with: the connection file Jupyter's clients read names what the relay serves.
        if self.ports is None:
            wanted = {f"{c}_port": getattr(km, f"{c}_port") for c in (*BIND, "hb")}
            self.ports = await self._host.call(_bind_ports(km.ip, wanted))
            for name, number in self.ports.numbers.items():
                setattr(km, name, number)
        km.write_connection_file()
        self.connection_info = km.get_connection_info()
        key = self.connection_info.get("key", b"")
        self._key = key.decode() if isinstance(key, bytes) else str(key)
        self._scheme = str(self.connection_info.get("signature_scheme", "hmac-sha256"))
        return await super().pre_launch(cmd=[], **kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        self._terminated = None
        conn = KernelConnection(key=self._key, signature_scheme=self._scheme)
        relay = self.relay
        if (
            self.session_id is not None
            and relay is not None
            and relay.died is None
            and relay.final is None
        ):
            status = await self._host.call(self._restart(conn))
            relay.restarted(status.generation)
            return self.connection_info
        await self._close_relay()
        try:
            info = await self._host.call(self._start(conn))
        except BaseException:
            self._release_ports()  # jupyter_client cleans up nothing after a failed start
            raise
        self.session_id = info.id
        self.log.info("GPUlayer kernel %s: session %s queued", self.kernel_id, info.name)
        try:
            await self._host.call(self._placed(info.id))
        except BaseException:
            await self._host.call(self._stop(info.id, "ended: its kernel did not start"))
            self.session_id = None
            self._release_ports()
            raise
        self.relay = await self._host.call(self._bind(info.id))
        if self._folder is not None:
            self._workspace = await self._host.call(self._open_workspace(info.id, self.relay))
        return self.connection_info

    async def _open_workspace(self, session_id: str, relay: LocalRelay) -> Any:
        """The workspace's hooks on the relay (ADR 0022): nothing in place; synced, the folder
        goes now and each cell's changes before it."""
        from ..client.workspace import link_for
        from ..workspace.kernel import open_for_kernel

        assert self._folder is not None
        ws = await open_for_kernel(link_for(await self._host.link()), session_id, self._folder)
        relay.workspace = ws
        return ws

    async def _start(self, conn: KernelConnection) -> SessionInfo:
        link = await self._host.link()
        holder = SessionHolder(
            client=f"kernel-{self.kernel_id}",
            kernel=self.kernel_id,
            notebook=self._notebook,
        )
        from ..workspace.plan import host_id

        source = None
        if self._folder is not None:
            source = WorkspaceSource(folder=self._folder, host=host_id())
        req = KernelStart(
            gpus=self.gpus,
            gpu_kind=list(self.gpu_kind),
            key=conn.key,
            signature_scheme=conn.signature_scheme,
            holder=holder,
            wait_for_capacity=True,
            workspace=source,
            # The notebook's name, as a local kernel gets it from jupyter_server.
            env={"JPY_SESSION_NAME": self._notebook} if self._notebook else {},
            **({} if self.idle_timeout is None else {"idle_timeout": self.idle_timeout}),
        )
        return await link.start(req)

    async def _placed(self, session_id: str) -> None:
        """Wait (``wait`` seconds at most) until the session runs, logging each new reason of
        the queue once; fail at once when the scheduler says waiting cannot help."""
        link = await self._host.link()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        said = ""
        logged: object = None
        while True:
            info = await link.session(session_id)
            state = info.job.state
            if state == JobState.RUNNING:
                return
            if state.terminal:
                why = info.job.reason or state.value
                raise KernelStartFailed(f"the GPU kernel's session ended before it ran: {why}")
            report = info.job.pending if state == JobState.QUEUED else None
            if state == JobState.QUEUED:
                said = await link.explain(session_id) or said
            if report is not None and report.never_fits:
                raise KernelStartFailed(f"no worker here can ever run this GPU kernel: {said}")
            # The sentence carries ages ("idle for 3 min"): a new line only for a new reason.
            why_now = _reasons(report) if report is not None else said
            if said and why_now != logged:
                self.log.warning("GPUlayer kernel %s waits: %s", self.kernel_id, said)
                logged = why_now
            if loop.time() >= deadline:
                raise KernelStartFailed(
                    f"no GPU for this kernel within {self.max_wait:g}s (the kernel spec's --wait): "
                    f"{said or state.value}"
                )
            # The session's state is read again on each page of the relay's long-poll; before
            # the relay exists, a short pause between reads (retry backoff of a queued start).
            await asyncio.sleep(min(0.25, max(0.0, deadline - loop.time())))

    async def _bind(self, session_id: str) -> LocalRelay:
        link = await self._host.link()

        async def reattach() -> None:
            conn = KernelConnection(key=self._key, signature_scheme=self._scheme)
            await link.attach(session_id, conn)

        assert self.ports is not None, "pre_launch binds the ports"
        relay = LocalRelay(
            link, session_id, dict(self.connection_info), self.ports, on_lost_key=reattach
        )
        relay.start()
        return relay

    async def _restart(self, conn: KernelConnection) -> Any:
        link = await self._host.link()
        assert self.session_id is not None
        return await link.restart(self.session_id, conn)

    async def _stop(self, session_id: str, reason: str) -> None:
        link = await self._host.link()
        try:
            await link.stop(session_id, reason)
        except GPUlayerError as exc:
            self.log.info("GPUlayer kernel %s: stopping: %s", self.kernel_id, exc.message)

    # -- its life ---------------------------------------------------------------------------------

    async def poll(self) -> int | None:
        if self._terminated is not None:
            return self._terminated
        relay = self.relay
        if relay is None:
            return None if self.session_id is not None else 0
        if relay.died is not None:
            return 1
        return relay.exit_code

    async def wait(self) -> int | None:
        while (code := await self.poll()) is None:
            relay = self.relay
            if relay is None:
                await asyncio.sleep(0.1)
                continue
            relay.changed.clear()
            # The relay lives on the host loop; its event is read from here across threads,
            # so the wait is bounded (the event is a hint, the poll is the truth).
            await asyncio.sleep(0.05)
        return code

    async def send_signal(self, signum: int) -> None:
        if self.session_id is None:
            return
        if signum == signal.SIGINT:
            sid = self.session_id
            if self.relay is not None and self.relay.final is not None:
                return  # its session ended: nothing runs to interrupt

            async def interrupt() -> None:
                link = await self._host.link()
                try:
                    await link.interrupt(sid)
                except GPUlayerError as exc:
                    # jupyter_client interrupts before every shutdown, also when the control
                    # plane is gone (the server extension stops before the kernels): raising
                    # here would abort the shutdown and leave the session to its idle timeout.
                    self.log.warning(
                        "GPUlayer kernel %s: interrupt: %s", self.kernel_id, exc.message
                    )

            await self._host.call(interrupt())
        elif signum in (signal.SIGTERM, signal.SIGKILL):
            await self.kill()

    async def kill(self, restart: bool = False) -> None:
        await self._end(restart, -int(signal.SIGKILL))

    async def terminate(self, restart: bool = False) -> None:
        await self._end(restart, -int(signal.SIGTERM))

    async def _end(self, restart: bool, code: int) -> None:
        if restart:
            # The next launch starts a new process on the same GPUs (the old one is killed
            # there): the session, and so its GPUs, stay.
            self._terminated = code
            return
        await self.cleanup(restart=False)
        self._terminated = code

    async def cleanup(self, restart: bool = False) -> None:
        if restart:
            return
        sid, self.session_id = self.session_id, None
        await self._close_relay()
        self._release_ports()
        if sid is not None:
            # A session has no end of its own: its job ends ``cancelled``, and its reason says
            # that its user ended it (the state machine's word for an end asked for).
            reason = "stopped by the user (its kernel was shut down in Jupyter)"
            await self._host.call(self._stop(sid, reason))

    async def _close_relay(self) -> None:
        ws, self._workspace = self._workspace, None
        if ws is not None:
            self._host.loop.call_soon_threadsafe(ws.close)  # it lives on the host loop
        relay, self.relay = self.relay, None
        if relay is not None:
            await self._host.call(relay.close())

    def _release_ports(self) -> None:
        ports, self.ports = self.ports, None
        if ports is not None:
            self._host.loop.call_soon_threadsafe(ports.close)  # bound on the host loop

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info["session_id"] = self.session_id
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.session_id = provisioner_info.get("session_id")

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        # The shutdown request travels through the control plane and back: allow for it.
        return max(recommended, 10.0)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, 20.0)


async def _bind_ports(ip: str, wanted: dict[str, int]) -> Ports:
    """(On the host loop, where the relay will use them.)"""
    return Ports(ip, wanted)


def _reasons(report: PlacementReport) -> object:
    """What a queued kernel waits for, without the sentence's ages and queue position: a
    change of it is a new reason, worth a new log line."""
    scaling = report.scaling.code if report.scaling is not None else None
    return (
        report.model_dump_json(include={"filtered", "exhausted", "quota", "fair_share"}),
        report.reserved_by,
        scaling,
        tuple(sorted((h.session_id, h.idle_since is None) for h in report.sessions)),
    )
