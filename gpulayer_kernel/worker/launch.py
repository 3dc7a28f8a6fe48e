"""How a job's processes are launched on its devices: plain, or through torchrun (ADR 0007).

A job on one device (or none) runs its argv as it is. A gang job runs under PyTorch's own launcher,
``torchrun`` (``python -m torch.distributed.run``), with a *static* rendezvous:

- one host: ``--nnodes 1 --nproc-per-node N`` with an explicit ``--master-addr 127.0.0.1``
  and a port this worker reserved;
- several hosts: the rank-0 worker reserves a port on its advertised address and publishes
  ``(address, port)`` to the control plane; the other workers long-poll for that record (no
  sleeps), then start their own torchrun with their ``--node-rank``.

``CUDA_VISIBLE_DEVICES`` names exactly the placed devices. Each rank runs behind a one-line shell
shim that gives it its own ``$GPULAYER_OUTPUT/rank<R>`` (artifacts are named by rank) and, through
``setpriv --pdeathsig SIGKILL``, dies with its torchrun: torchrun starts every rank in a session
of its own, so stopping the job's process group alone would orphan them.

torchrun's ``--tee 3`` prefixes each line of a rank with ``[default<local rank>]:``;
:class:`Launch` takes those lines apart into ranks, keeps each rank's last lines, and reads
torchrun's error summary ("Root Cause (first observed failure)") to name the failing rank.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import JobAssignment, PythonWorkload, Rendezvous
from ..errors import GPUlayerError
from ..job import OUTPUT_ENV
from .config import ExecutorConfig
from .exits import describe_exit
from .ports import PortReservations, interface_for
from .transport import Transport

LAUNCHER_LOGS_ENV = "GPULAYER_LAUNCHER_LOGS"
"""Job setting: ``1`` ships torchrun's own lines (its error dump, its warnings) to the job's log."""
TAIL_LINES = 12  # lines of the failing rank quoted in the job's failure reason
MAX_TAIL_CHARS = 300  # per quoted line
PEER_GRACE = 3.0  # seconds a node whose ranks only lost a peer waits for the root cause's report

_SETPRIV = shutil.which("setpriv")
# Runs as each rank's program: a per-rank output directory, then exec the job (pid unchanged, so
# torchrun's signals reach it). ``$0`` is a label for ps; "$@" is the job's own argv.
_RANK_SHIM = 'GPULAYER_OUTPUT="$GPULAYER_OUTPUT/rank$RANK"; export GPULAYER_OUTPUT; exec "$@"'
_TEE_PREFIX = re.compile(r"^\[default(\d+)\]:(.*)$", re.DOTALL)
# torch >= 2.3 prefixes a rank's uncaught exception with "[rank<R>]: "; we tag ranks already.
_TORCH_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
_ROOT_CAUSE = re.compile(r"^Root Cause \(first observed failure\)")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_SUMMARY_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)):\s*(.*)$")
_ADDR_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
# A rank that fails with one of these lost a peer (it crashed, or its node went away): the
# root cause is elsewhere. gloo, NCCL and the c10d store each word it their own way.
_PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote process exited|"
    r"peer (?:process|rank) .* (?:exited|crashed)|NCCL communicator was aborted",
    re.IGNORECASE,
)


def is_gang(a: JobAssignment) -> bool:
    """True when the job has more than one rank (and is not running on its CPU fallback)."""
    return a.job.spec.is_gang and not a.node.cpu_fallback


def device_env(a: JobAssignment) -> dict[str, str]:
    """Which devices the job may see. Simulated and CPU-fallback jobs see no CUDA device."""
    node = a.node
    env = {"GPULAYER_DEVICES": ",".join(map(str, node.devices))}
    if node.simulated or node.cpu_fallback or not node.devices:
        env["CUDA_VISIBLE_DEVICES"] = ""
        if node.simulated:
            env["GPULAYER_SIMULATED"] = "1"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.devices))
    return env


class Launch:
    """The launch of one assignment: its argv, its ranks' lines, and why it failed.

    The executor makes one per attempt and calls :meth:`wrap` before spawning,
    :meth:`split` on every output line, :meth:`failure_reason` when the process fails,
    :meth:`artifact_name` per output file, and :meth:`close` at the end (releases the port).
    """

    def __init__(
        self,
        a: JobAssignment,
        transport: Transport,
        config: ExecutorConfig,
        system: Callable[[str], None] = lambda _text: None,
        *,
        ports: PortReservations,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.a = a
        self.transport = transport
        self.config = config
        self.system = system
        self.ports = ports  # the worker's: one port is never held for two of its jobs
        self.clock = clock
        self.gang = is_gang(a)
        self.nproc = max(1, len(a.node.devices))
        self.rank_base = a.node.node_rank * self.nproc  # static rendezvous: node-major ranks
        self.master: tuple[str, int] | None = None
        self._reservation: socket.socket | None = None
        self._tails: dict[int, deque[tuple[bool, str]]] = {}
        self._in_summary = False
        self._root: dict[str, str] = {}
        self._launcher_error: str | None = None
        self._addr_in_use = False
        # torchrun's own lines (no rank prefix) are read for the failure reason but kept out of
        # the log unless the job asks: a failing gang would show ~40 lines of ChildFailedError
        # around the rank's own traceback, a cancelled one a SignalException, a finished
        # multi-node one an exit-barrier error.
        self.show_launcher = a.job.spec.env.get(LAUNCHER_LOGS_ENV, "") not in ("", "0")
        self.hidden = 0

    # -- before the spawn ------------------------------------------------------------------------

    async def wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The argv to spawn: the job's own, or torchrun around it for a gang. Updates ``env``."""
        if not self.gang:
            env.setdefault("RANK", "0")
            env.setdefault("WORLD_SIZE", "1")
            env.setdefault("LOCAL_RANK", "0")
            return argv
        a, config = self.a, self.config
        addr, port = await self.meet(env)
        # When a rank fails, torchrun SIGTERMs the others and SIGKILLs them after this long
        # (default 30 s): fail fast within the same grace the worker gives a cancelled job.
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", f"{max(1, int(config.kill_grace))}")
        env["GPULAYER_WORLD_SIZE"] = str(self.nproc * a.nnodes)
        # torchrun would set 1 thread per rank itself and print a banner into every job's log;
        # share the host's cores between the ranks instead, unless the job chose.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc)))
        out = Path(env[OUTPUT_ENV])
        for rank in range(self.rank_base, self.rank_base + self.nproc):
            # Every rank finds its $GPULAYER_OUTPUT ready, as a single-process job does.
            (out / f"rank{rank}").mkdir(parents=True, exist_ok=True)
        logs = out.parent / "torchrun"  # in the job dir: removed with it
        launcher = [
            config.python,
            "-m",
            "torch.distributed.run",
            f"--nnodes={a.nnodes}",
            f"--nproc-per-node={self.nproc}",
            f"--node-rank={a.node.node_rank}",
            f"--master-addr={addr}",
            f"--master-port={port}",
            "--max-restarts=0",  # no distributed retry: a failed rank fails the gang
            "--monitor-interval=0.1",  # notice a dead rank within 0.1 s (older torch: 5 s)
            "--tee=3",
            f"--log-dir={logs}",
            "--no-python",
        ]
        if not isinstance(a.job.spec.workload, PythonWorkload) and argv[0] in (
            "python",
            "python3",
            sys.executable,
        ):
            # torchrun runs scripts with its own interpreter; so do we: the one with torch.
            argv = [config.python, *argv[1:]]
        deathsig = [_SETPRIV, "--pdeathsig", "SIGKILL", "--"] if _SETPRIV else []
        last = self.rank_base + self.nproc - 1
        ranks = f"rank {last}" if self.nproc == 1 else f"ranks {self.rank_base}-{last}"
        self.system(
            f"torchrun: {ranks} of {self.nproc * a.nnodes} here (node {a.node.node_rank} of "
            f"{a.nnodes}), rendezvous at {addr}:{port}"
        )
        return [*launcher, "/bin/sh", "-c", _RANK_SHIM, "gpulayer-rank", *deathsig, *argv]

    async def meet(self, env: dict[str, str]) -> tuple[str, int]:
        """Where the ranks meet (static rendezvous): a port reserved here on one host; on
        several, the rank-0 worker's (published by it, long-polled by the others). Sets the
        NIC variables in ``env`` for a multi-node gang. Also used by sessions (ADR 0019)."""
        a, config = self.a, self.config
        if a.nnodes == 1:
            addr = "127.0.0.1"
            port = self._reserve(addr)
        elif a.node.node_rank == 0:
            addr = config.advertise_addr
            port = self._reserve(addr)
            await self.transport.publish_rendezvous(
                a.job.id, Rendezvous(master_addr=addr, master_port=port)
            )
        else:
            rdzv = await self._await_rendezvous()
            addr, port = rdzv.master_addr, rdzv.master_port
        self.master = (addr, port)
        if a.nnodes > 1:
            # gloo and NCCL pick their interface from the hostname, which inside a container or
            # network namespace may name an unreachable address (or fall back to loopback):
            # point them at the interface that holds the address this worker advertises.
            ifname = interface_for(config.advertise_addr)
            if ifname is not None:
                env.setdefault("GLOO_SOCKET_IFNAME", ifname)
                env.setdefault("NCCL_SOCKET_IFNAME", ifname)
        return addr, port

    def _reserve(self, host: str) -> int:
        try:
            self._reservation = self.ports.reserve(host)
        except OSError:
            # The advertised address is not local (NAT, a load balancer): any local address.
            self._reservation = self.ports.reserve("0.0.0.0")
        return int(self._reservation.getsockname()[1])

    async def _await_rendezvous(self) -> Rendezvous:
        """Long-poll the control plane for rank 0's record until ``rendezvous_timeout``."""
        timeout, clock = self.config.rendezvous_timeout, self.clock
        deadline = clock.monotonic() + timeout
        while True:
            left = deadline - clock.monotonic()
            started = clock.monotonic()
            try:
                return await self.transport.get_rendezvous(self.a.job.id, wait=max(0.0, left))
            except GPUlayerError as exc:
                # A transport may cap one long-poll below our wait; it then answers
                # "rendezvous_pending" after the cap and we ask again. An answer well before
                # the wait ran out means the job was stopped: give up at once.
                spent = clock.monotonic() - started
                pending = getattr(exc, "code", "") == "rendezvous_pending"
                if pending and spent >= min(left, 1.0) - 0.05 and deadline - clock.monotonic() > 0:
                    continue
                raise GPUlayerError(
                    f"rendezvous did not complete within {timeout:g}s: {exc.message}",
                    hint="check that the rank-0 worker is running and reachable at its "
                    "--advertise-addr",
                ) from None

    # -- while it runs ---------------------------------------------------------------------------

    def splitter(self, stream: str) -> Callable[[str], tuple[int | None, str]] | None:
        """For one of the process's pipes, the function that tags each line with its global rank
        (torchrun tees a rank's stdout to its stdout, stderr to stderr); None when not a gang."""
        if not self.gang:
            return None
        is_err = stream == "stderr"
        return lambda text: self.split(text, is_err)

    def router(self, stream: str) -> Callable[[str], tuple[int | None, str] | None] | None:
        """:meth:`splitter`, holding back torchrun's own lines (counted in :attr:`hidden`) unless
        the job set ``GPULAYER_LAUNCHER_LOGS=1``; None when not a gang."""
        split = self.splitter(stream)
        if split is None or self.show_launcher:
            return split

        def route(text: str) -> tuple[int | None, str] | None:
            assert split is not None
            rank, body = split(text)
            if rank is None:
                self.hidden += 1
                return None
            return rank, body

        return route

    def launcher_note(self) -> str | None:
        """For a failed gang whose launcher lines were held back: how to see them."""
        if not self.hidden:
            return None
        return (
            f"torchrun's own {self.hidden} line(s) (its error report) are not shown; "
            f"run the job with --env {LAUNCHER_LOGS_ENV}=1 to see them"
        )

    def split(self, text: str, is_err: bool = False) -> tuple[int | None, str]:
        """Take a torchrun-prefixed line apart into (global rank, text); remember the tail."""
        m = _TEE_PREFIX.match(text)
        if m is None:
            if is_err:
                self._launcher_line(text)
            return None, text
        rank = self.rank_base + int(m.group(1))
        body = m.group(2)
        tagged = _TORCH_RANK_PREFIX.match(body)
        if tagged is not None and int(tagged.group(1)) == rank:
            body = body[tagged.end() :]
        tail = self._tails.setdefault(rank, deque(maxlen=4 * TAIL_LINES))
        tail.append((is_err, body))
        return rank, body

    def _launcher_line(self, text: str) -> None:
        """Follow torchrun's own lines: its failure summary and its own fatal error."""
        if _ROOT_CAUSE.match(text):
            self._in_summary, self._root = True, {}
            return
        if self._in_summary:
            for key, pattern in (
                ("rank", _SUMMARY_RANK),
                ("exitcode", _SUMMARY_EXIT),
                ("host", _SUMMARY_HOST),
            ):
                m = pattern.match(text)
                if m is not None:
                    self._root.setdefault(key, m.group(1))
            if text.startswith("====="):
                self._in_summary = False
            return
        m = _EXCEPTION_LINE.match(text.strip())
        if m is not None:
            self._launcher_error = f"{m.group(1)}: {m.group(2)}".strip()
            self._addr_in_use = self._addr_in_use or bool(_ADDR_IN_USE.search(text))

    # -- after it exits --------------------------------------------------------------------------

    def failure_reason(self, code: int | None) -> str | None:
        """For a gang: name the first failing rank (from torchrun's summary) and quote its tail."""
        if not self.gang:
            return None
        if "rank" in self._root:
            rank = int(self._root["rank"])
            exitcode = int(self._root.get("exitcode", "1"))
            where = "" if self.a.nnodes > 1 else f" on {self.a.node.worker_name}"
            lost = " after losing a peer (look at the other nodes)" if self.peer_failure() else ""
            said = describe_exit(exitcode, subject=f"rank {rank}{where}")
            return f"{said}{lost}" + self._quote(rank)
        if self._launcher_error is not None:
            if self._addr_in_use and self.master is not None:
                return (
                    f"torchrun could not listen on {self.master[0]}:{self.master[1]} (address "
                    f"already in use) before any rank started: {self._launcher_error}"
                )
            return f"torchrun failed before its ranks finished: {self._launcher_error}"
        # No summary (torchrun itself was killed): the first rank that printed a traceback.
        for rank in sorted(self._tails):
            if any("Traceback" in text for _, text in self._tails[rank]):
                return f"rank {rank} failed" + self._quote(rank)
        return None

    def peer_failure(self) -> bool:
        """True when this node's failing rank only lost a peer: the root cause is elsewhere."""
        if not self.gang or self.a.nnodes == 1 or "rank" not in self._root:
            return False
        tail = self._tails.get(int(self._root["rank"]), ())
        return any(_PEER_LOST.search(text) for _, text in tail)

    def _quote(self, rank: int) -> str:
        tail = list(self._tails.get(rank, ()))
        errs = [text for is_err, text in tail if is_err]
        lines = (errs or [text for _, text in tail])[-TAIL_LINES:]
        if not lines:
            return " (it printed nothing)"
        body = "\n".join(
            "  " + (t if len(t) <= MAX_TAIL_CHARS else t[: MAX_TAIL_CHARS - 1] + "…") for t in lines
        )
        return f"; last lines of rank {rank}:\n{body}"

    def artifact_name(self, relative: str) -> tuple[str, int | None]:
        """An output file's artifact name and rank: a gang's files are under ``rank<R>/``."""
        if not self.gang:
            return relative, None
        head, _, _ = relative.partition("/")
        if head.startswith("rank") and head[4:].isdigit():
            return relative, int(head[4:])
        # Written straight into the node's directory (not through $GPULAYER_OUTPUT).
        return f"node{self.a.node.node_rank}/{relative}", None

    def close(self) -> None:
        """Release the reserved port (torchrun has exited by now)."""
        if self._reservation is not None:
            self.ports.release(self._reservation)
            self._reservation = None
