"""The worker's side of a warm job process: a spare waiting for a job, and a job once launched.

A :class:`Spare` is a job process the zygote forked ahead of time (``zygote.py``): its pid (the
job's process group once it runs) and the channel it listens on. :meth:`Spare.hand` sends it a
job with the job's stdio, and returns once it took the job, or False when it had died while idle
(its channel is closed then: it is dropped, never handed a job). A :class:`ZygoteChild` is a
launched job, shaped like an asyncio ``Process``: its stdout and stderr as StreamReaders, and its
exit status from the zygote's report (the worker is not its parent: it cannot ``waitpid`` it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket

from ..clock import Clock

TAKE_TIMEOUT = 10.0  # seconds a spare gets to answer that it took its job


class ZygoteChild:
    """A job process forked by the zygote, shaped like :class:`asyncio.subprocess.Process`."""

    def __init__(
        self,
        pid: int,
        exited: asyncio.Future[int],
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._exited = exited
        self._transports = transports

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        """The exit status the zygote reported (it reaped the process; we are not its parent)."""
        return await asyncio.shield(self._exited)

    def stop_now(self) -> None:
        """Kill the job now: its process group (the job's process leads it); the zygote, its
        parent, kills what left the group once the job's process is gone."""
        kill_group(self.pid)

    def close(self) -> None:
        """Close the pipes' read ends (a grandchild outside the group may still hold them)."""
        for t in self._transports:
            t.close()


def kill_group(pgid: int) -> None:
    """SIGKILL a warm job's process group, which may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Pipes:
    """A job's stdout and stderr pipes, and its stdin (``/dev/null`` or a dup of an fd)."""

    def __init__(self, stdin: int | None = None) -> None:
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.stdin = (
            os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            if stdin is None
            else os.dup(stdin)  # closed with the others: the caller keeps its own
        )

    @property
    def theirs(self) -> list[int]:
        """What the job gets as fds 0, 1 and 2."""
        return [self.stdin, self.out_w, self.err_w]

    def sent(self) -> None:
        """The job has its ends (or never will): close ours of them."""
        for fd in self.theirs:
            with contextlib.suppress(OSError):
                os.close(fd)

    def abandon(self) -> None:
        """No job will read or write them: close everything."""
        self.sent()
        for fd in (self.out_r, self.err_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    async def child(self, pid: int, exited: asyncio.Future[int]) -> ZygoteChild:
        """The launched job, reading our ends of its pipes."""
        loop = asyncio.get_running_loop()
        readers: list[asyncio.StreamReader] = []
        transports: list[asyncio.BaseTransport] = []
        for fd in (self.out_r, self.err_r):
            reader = asyncio.StreamReader(limit=2**16)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_read_pipe(
                lambda p=protocol: p,  # type: ignore[misc]
                open(fd, "rb", buffering=0),
            )
            readers.append(reader)
            transports.append(transport)
        return ZygoteChild(pid, exited, readers[0], readers[1], transports)


class Spare:
    """One job process forked ahead of time: its pid and its job channel."""

    def __init__(self, pid: int, chan: socket.socket) -> None:
        self.pid = pid  # the job's process group once it runs
        self.chan = chan
        chan.setblocking(False)

    async def hand(self, request: dict[str, object], pipes: Pipes, clock: Clock) -> bool:
        """Give this spare its job; True once it took it, False if it was dead (or hung).

        Its answer (``took``) comes before it changes anything it inherited, so a spare that
        died while idle (killed, OOM: its channel closes) is told apart from a job that failed
        at once. Its exit status comes from the zygote, its parent, as any job's.
        """
        loop = asyncio.get_running_loop()
        try:
            socket.send_fds(self.chan, [json.dumps(request).encode()], pipes.theirs)
        except OSError:  # closed: the spare is gone
            self.close()
            return False
        answered: asyncio.Future[bool] = loop.create_future()

        def readable() -> None:
            try:
                data = self.chan.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not answered.done():
                answered.set_result(bool(data) and "took" in json.loads(data))
            self.close()

        loop.add_reader(self.chan.fileno(), readable)
        try:
            took = await clock.wait_for(answered, TAKE_TIMEOUT) and answered.result()
            if not answered.done():  # hung: it must never start this job later
                kill_group(self.pid)
        except BaseException:
            self.close()
            raise
        if not took:
            self.close()
        return took

    def close(self) -> None:
        """Hang up: an idle spare's job process exits quietly."""
        if self.chan.fileno() < 0:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.chan.fileno())
        with contextlib.suppress(OSError):
            self.chan.close()
