"""``FakeProvider``: a provider whose machines are real ``gpulayer worker`` processes on this host.

Everything about it is real except the machine: it boots after ``boot_seconds`` (on the control
plane's clock), fails to boot with ``boot_failure_rate``, refuses launches with
``launch_failure_rate``, can hang on launch (``launch_hangs``), is preempted ``preempt_after``
seconds after it boots (or when a test calls ``preempt``), holds at most ``max_instances``, and
bills its price per second of life (``Reported.charge``). A machine is a ``gpulayer worker
--simulate-gpus N`` in its own session; preempting it SIGKILLs the worker and every process
under it, as a reclaimed cloud machine would vanish.

With a ``home`` its machines are kept in a state file, so a control plane that restarts (or was
killed mid-launch) finds the machines it launched, exactly as with a real provider. Tests that
need thousands of machines pass ``start_machine``: a factory of in-process machines
(``gpulayer_kernel.testing.machines``), same provider, no processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Offer
from ..errors import ProviderError
from .base import TOKEN_ENV, Census, Check, LaunchSpec, Reported, ReportedState, worker_argv
from .config import FakeOffer, FakeSettings

log = logging.getLogger("gpulayer.providers")
MARK_ENV = "GPULAYER_FAKE_MACHINE"  # in each machine's environment: how its processes are found
GIB = 1 << 30


class Machine(Protocol):
    """What runs on a fake machine once it booted."""

    def alive(self) -> bool: ...

    async def stop(self, *, kill: bool) -> None: ...


MachineFactory = Callable[[Offer, str, LaunchSpec, str], Awaitable[Machine]]


@dataclass
class _Record:
    external_id: str
    instance_id: str
    offer: str
    price_per_hour: float
    state: ReportedState
    launched_at: float
    booted_at: float | None = None
    ended_at: float | None = None
    detail: str = ""
    pid: int | None = None
    token: str = ""  # kept only until the machine boots (a real provider holds it that long)
    worker_name: str = ""
    server_url: str = ""
    ca_cert: str | None = None
    acknowledged: bool = False  # terminate() was called on it: GPUlayer knows it ended


class FakeProvider:
    """A simulated cloud whose machines are real workers on this host (see the module doc)."""

    kind = "fake"

    def __init__(
        self,
        settings: FakeSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        home: Path | None = None,
        start_machine: MachineFactory | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.max_instances = settings.max_instances
        self.clock = clock
        self.home = home
        self.rng = rng or random.Random(settings.seed)
        self._start_machine = start_machine or self._process_machine
        self._records: dict[str, _Record] = {}
        self._machines: dict[str, Machine] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._seq = 0
        self.launches = 0  # launch calls answered (tests count them)
        self._resumed = False
        self._load()

    # -- the protocol ----------------------------------------------------------------------------

    async def offers(self) -> list[Offer]:
        return [self._offer(o) for o in self.settings.offers]

    def _offer(self, o: FakeOffer) -> Offer:
        s = self.settings
        return Offer(
            provider=self.name,
            name=o.name,
            region=o.region or s.region,
            gpus=o.gpus,
            gpu_kind=o.gpu_kind if o.gpus else "",
            gpu_memory=int(o.gpu_memory_gb * GIB) if o.gpus else 0,
            cpus=o.cpus,
            labels=o.labels,
            price_per_hour=o.price_per_hour,
            boot_seconds=s.boot_seconds,
            simulated=True,
        )

    def where(self, offer: Offer, instance_id: str) -> str | None:
        return None  # found by its instance id until the launch answers with its own

    async def launch(self, offer: Offer, instance_token: str, how: LaunchSpec) -> str:
        s = self.settings
        if s.launch_hangs:
            await asyncio.Event().wait()  # never answers: the autoscaler's timeout ends it
        if s.launch_delay:
            await self.clock.sleep(s.launch_delay)
        if s.launch_failure_rate and self.rng.random() < s.launch_failure_rate:
            raise ProviderError(
                f"{self.name}: launch refused (simulated, launch_failure_rate "
                f"{s.launch_failure_rate:g})",
                hint="a fake failure: the autoscaler backs off and tries again",
            )
        live = sum(1 for r in self._records.values() if r.state in ("booting", "running"))
        if live >= self.max_instances:
            raise ProviderError(
                f"{self.name}: no capacity ({live} of {self.max_instances} machines in use)",
                hint="raise max_instances or wait for a machine to end",
            )
        self._seq += 1
        rec = _Record(
            external_id=f"fake-{os.getpid()}-{self._seq}-{how.instance_id[:6]}",
            instance_id=how.instance_id,
            offer=offer.id,
            price_per_hour=offer.price_per_hour,
            state="booting",
            launched_at=self.clock.now(),
            token=instance_token,
            worker_name=how.worker_name,
            server_url=how.server_url,
            ca_cert=how.ca_cert,
        )
        self._records[rec.external_id] = rec
        self.launches += 1
        self._save()
        self._boot_later(rec, offer, how, s.boot_seconds)
        if s.answer_delay:
            await self.clock.sleep(s.answer_delay)  # recorded here, not yet answered there
        return rec.external_id

    async def terminate(self, instance_id: str, external_id: str | None) -> None:
        for rec in self._find(instance_id, external_id):
            task = self._tasks.pop(rec.external_id, None)
            if task is not None:
                task.cancel()
            await self._stop_machine(rec, kill=False)
            if rec.state in ("booting", "running"):
                self._end(rec, "ended", "terminated")
            rec.acknowledged = True
        self._save()
        if self.settings.terminate_delay:  # an SSH host waits for its worker to exit
            await self.clock.sleep(self.settings.terminate_delay)

    async def instances(self) -> Census:
        if not self._resumed:
            self._resume()
        now = self.clock.now()
        out = []
        for rec in self._records.values():
            machine = self._machines.get(rec.external_id)
            if rec.state == "running" and not self._alive(rec, machine):
                self._end(rec, "failed", "its worker process exited")
            if rec.acknowledged:
                continue
            end = rec.ended_at if rec.ended_at is not None else now
            charge = rec.price_per_hour * max(0.0, end - rec.launched_at) / 3600.0
            out.append(Reported(rec.external_id, rec.instance_id, rec.state, rec.detail, charge))
        return Census(tuple(out))

    async def check(self) -> Check:
        offers = await self.offers()
        return Check(True, f"simulated provider, {len(offers)} offer(s)", tuple(offers))

    async def close(self) -> None:
        """Stop watching; machines keep running (a real provider's would), unless in-process."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        if self.home is None:  # in-process machines cannot outlive us: end them
            for rec in self._records.values():
                await self._stop_machine(rec, kill=True)
        self._save()

    # -- for tests: what a real provider's own world would do -------------------------------------

    async def preempt(self, instance_id: str, detail: str = "preempted (simulated)") -> None:
        """Take the machine back now: its worker and every process under it die at once."""
        for rec in self._records.values():
            if rec.instance_id == instance_id and rec.state in ("booting", "running"):
                task = self._tasks.pop(rec.external_id, None)
                if task is not None:
                    task.cancel()
                await self._stop_machine(rec, kill=True)
                self._end(rec, "preempted", detail)
        self._save()

    async def launch_stray(self, offer: Offer, how: LaunchSpec) -> str:
        """A machine GPUlayer never asked for (a leak to find): tagged, not in any record."""
        ext = await self.launch(offer, "glt_i_000000000000_stray", how)
        return ext

    def live(self) -> list[str]:
        """External ids of machines that are booting or running."""
        return [e for e, r in self._records.items() if r.state in ("booting", "running")]

    # -- machines --------------------------------------------------------------------------------

    def _boot_later(self, rec: _Record, offer: Offer, how: LaunchSpec, delay: float) -> None:
        async def boot() -> None:
            await self.clock.sleep(delay)
            if (
                self.settings.boot_failure_rate
                and self.rng.random() < self.settings.boot_failure_rate
            ):
                self._end(rec, "failed", "boot failed (simulated, boot_failure_rate)")
                self._save()
                return
            try:
                self._machines[rec.external_id] = await self._start_machine(
                    offer, rec.token, how, rec.external_id
                )
            except Exception as exc:  # a machine that cannot start did not boot
                self._end(rec, "failed", f"its worker did not start: {exc}")
                self._save()
                return
            rec.state, rec.booted_at, rec.token = "running", self.clock.now(), ""
            machine = self._machines[rec.external_id]
            rec.pid = getattr(machine, "pid", None)
            self._save()
            if self.settings.preempt_after is not None:
                await self.clock.sleep(self.settings.preempt_after)
                await self.preempt(rec.instance_id, "preempted (simulated, preempt_after)")

        task = asyncio.get_running_loop().create_task(boot())
        self._tasks[rec.external_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(rec.external_id, None))

    def _alive(self, rec: _Record, machine: Machine | None) -> bool:
        if machine is not None:
            return machine.alive()
        return rec.pid is not None and _marked(rec.pid, rec.external_id)

    async def _stop_machine(self, rec: _Record, *, kill: bool) -> None:
        machine = self._machines.pop(rec.external_id, None)
        if machine is not None:
            await machine.stop(kill=kill)
        elif rec.pid is not None and _marked(rec.pid, rec.external_id):
            _kill_tree(rec.pid, signal.SIGKILL if kill else signal.SIGTERM)

    def _end(self, rec: _Record, state: ReportedState, detail: str) -> None:
        rec.state, rec.detail, rec.ended_at, rec.token = state, detail, self.clock.now(), ""

    def _find(self, instance_id: str, external_id: str | None) -> list[_Record]:
        return [
            r
            for r in self._records.values()
            if r.external_id == external_id or r.instance_id == instance_id
        ]

    async def _process_machine(
        self, offer: Offer, token: str, how: LaunchSpec, external_id: str
    ) -> Machine:
        root = (self.home or Path.cwd()) / "machines" / external_id
        root.mkdir(parents=True, exist_ok=True)
        argv = worker_argv(
            [sys.executable, "-m", "gpulayer_kernel.cli"], offer, how, work_dir=str(root / "work")
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        env.update({TOKEN_ENV: token, "GPULAYER_HOME": str(root), MARK_ENV: external_id})
        with (root / "worker.log").open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own machine: our death does not end it
            )
        return ProcessMachine(proc.pid, external_id)

    # -- state file ------------------------------------------------------------------------------

    @property
    def _state_file(self) -> Path | None:
        return None if self.home is None else self.home / f"fake-{self.name}.json"

    def _save(self) -> None:
        path = self._state_file
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in self._records.values()]))
        tmp.chmod(0o600)  # it holds instance tokens until their machines boot
        tmp.replace(path)

    def _load(self) -> None:
        path = self._state_file
        if path is None or not path.exists():
            return
        for item in json.loads(path.read_text()):
            rec = _Record(**item)
            self._records[rec.external_id] = rec
        self._seq = len(self._records)

    def _resume(self) -> None:
        """After a restart: boot the machines a dead predecessor launched but never booted."""
        self._resumed = True
        for rec in self._records.values():
            if rec.state != "booting" or not rec.token or rec.external_id in self._tasks:
                continue
            offer = next((o for o in self.settings.offers if self._offer(o).id == rec.offer), None)
            if offer is None:
                self._end(rec, "failed", "its offer is gone from the config")
                continue
            left = max(0.0, rec.launched_at + self.settings.boot_seconds - self.clock.now())
            how = LaunchSpec(rec.instance_id, rec.worker_name, rec.server_url, None, rec.ca_cert)
            self._boot_later(rec, self._offer(offer), how, left)


class ProcessMachine:
    """A ``gpulayer worker`` process in its own session, found again by the mark in its
    environment (a pid alone may be reused)."""

    def __init__(self, pid: int, external_id: str) -> None:
        self.pid = pid
        self.external_id = external_id

    def alive(self) -> bool:
        return _marked(self.pid, self.external_id)

    async def stop(self, *, kill: bool) -> None:
        if not self.alive():
            return
        _kill_tree(self.pid, signal.SIGKILL if kill else signal.SIGTERM)
        if not kill:
            # A clean stop: the worker leaves the control plane, then exits.
            for _ in range(100):
                if not self.alive():
                    return
                await asyncio.sleep(0.1)  # waiting for a process to exit; not a hot path
            _kill_tree(self.pid, signal.SIGKILL)


def _marked(pid: int, external_id: str) -> bool:
    """True while ``pid`` runs with our mark in its environment (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARK_ENV}={external_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[-1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _kill_tree(pid: int, sig: int) -> None:
    """Signal ``pid`` and every process under it (a job runs in a session of its own, so its
    group is not the worker's: the parent links are what tie a machine's processes together)."""
    tree = _children()
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(tree.get(p, ()))
    targets = seen if sig == signal.SIGKILL else [pid]  # SIGTERM: the worker stops its jobs
    for p in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
