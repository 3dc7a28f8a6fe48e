"""This machine's capabilities for a local worker, without importing torch on the way (ADR 0005).

``local_capabilities`` answers in three ways, cheapest first:

1. **simulated** GPUs when asked (``--simulate-gpus``, ``$GPULAYER_SIMULATE_GPUS``);
2. **the per-machine cache** (``machine.py``): the full probe's last answer for this machine,
   interpreter, torch build and driver, with fresh host facts — a file read;
3. **a first answer now, the full one in the background**: the devices from the driver (NVML or
   nvidia-smi in the isolated ``--no-torch`` probe, and only when ``driver.py`` finds an NVIDIA
   driver: nothing at all runs on a box without one) and torch's build facts from its files
   (``build.py``: version, CUDA or ROCm build); then ``BackgroundCheck`` runs the full probe,
   torch imported, in a process of its own that writes the cache and stops itself at a deadline.
   ``LocalProbe.checked()`` gives its answer to whoever is still there to re-register with it.

What the first answer leaves out it has not seen: no AMD or Apple device (only torch can drive
those, so only torch may report them) and no framework fact that needs a running torch
(``cuda_available``, MPS, the distributed backends). ``probe_sources`` says ``torch-build`` while
the framework facts come from the files only. The support matrix reads the first answer as it
reads any: NVIDIA GPUs are usable on their driver alone, gangs use gloo until NCCL is confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..contracts import Frameworks, WorkerCapabilities
from ..errors import InvalidInput
from .build import TorchBuild, read_torch_build, torch_dir
from .driver import DriverFacts, read_drivers
from .host import read_host
from .machine import MachineCache, cache_dir, machine_key
from .run import PROBE_MODULE, probe_env, run_probe
from .simulated import simulated_capabilities
from .support import with_runtime

log = logging.getLogger("gpulayer.capabilities")

SIMULATE_ENV = "GPULAYER_SIMULATE_GPUS"
SIMULATE_KIND_ENV = "GPULAYER_SIMULATE_KIND"
DEADLINE = 120  # seconds the background probe may take before it stops itself
BUILD_SOURCE = "torch-build"  # framework facts read from torch's files, not yet from torch


@dataclass
class LocalProbe:
    """What to register with now, and the background check's answer when one runs."""

    capabilities: WorkerCapabilities
    check: BackgroundCheck | None = None
    from_cache: bool = False

    async def checked(self) -> WorkerCapabilities | None:
        """The full probe's answer (None: no check runs, or it failed)."""
        return await self.check.result() if self.check is not None else None


async def local_capabilities(
    simulate_gpus: int | None = None,
    simulate_kind: str | None = None,
    *,
    cache: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> LocalProbe:
    """This machine's capabilities for a local worker (see the module docstring). ``cache``:
    the per-machine cache folder (default ``machine.cache_dir()``)."""
    env = os.environ if env is None else env
    if simulate_gpus is None and env.get(SIMULATE_ENV):
        try:
            simulate_gpus = int(env[SIMULATE_ENV])
        except ValueError:
            raise InvalidInput(
                f"{SIMULATE_ENV}={env[SIMULATE_ENV]!r} is not a number",
                hint=f"set {SIMULATE_ENV} to how many simulated GPUs the local worker has",
                details={"field": SIMULATE_ENV},
            ) from None
    if simulate_gpus:
        kind = simulate_kind or env.get(SIMULATE_KIND_ENV) or "a100-80gb"
        return LocalProbe(simulated_capabilities(simulate_gpus, kind))
    drivers = read_drivers()
    build = read_torch_build()
    has_torch = build is not None or torch_dir() is not None
    store = MachineCache(cache if cache is not None else cache_dir(env))
    key = machine_key(drivers, build, env)
    hit = store.read(key)
    if hit is not None:
        try:
            cached = WorkerCapabilities.model_validate(hit)
            return LocalProbe(cached.model_copy(update={"host": read_host()}), from_cache=True)
        except ValidationError:
            pass  # an entry this version cannot read: probe again
    caps = await first_answer(drivers, build, has_torch)
    if not has_torch:
        # Nothing a torch import could add: the first answer is the whole answer.
        if not any(e.startswith("probe:") for e in caps.probe_errors):
            store.write(key, caps.model_dump(mode="json"))
        return LocalProbe(caps)
    check = BackgroundCheck(store, key)
    check.start()
    return LocalProbe(caps, check)


async def first_answer(
    drivers: DriverFacts, build: TorchBuild | None, has_torch: bool
) -> WorkerCapabilities:
    """Devices from the driver, framework facts from torch's files: no torch import."""
    if drivers.nvidia_present:
        # NVML and nvidia-smi talk to the driver, which can hang: isolated, with a timeout.
        caps = await run_probe(timeout=30.0, args=["--no-torch"])
        caps = caps.model_copy(update={"host": read_host()})
    else:
        caps = WorkerCapabilities(host=read_host())
    errors = list(caps.probe_errors)
    sources = list(caps.probe_sources)
    frameworks = Frameworks()
    if build is not None:
        frameworks = Frameworks(
            torch_version=build.version, torch_cuda=build.cuda, torch_hip=build.hip
        )
        sources.append(BUILD_SOURCE)
    elif has_torch:
        errors.append("torch: its version file is unreadable; the background check imports it")
    else:
        errors.append("torch: not installed")
    return with_runtime(
        caps.model_copy(
            update={"frameworks": frameworks, "probe_errors": errors, "probe_sources": sources}
        )
    )


class BackgroundCheck:
    """The full probe (torch imported) in a process of its own, answering into the cache.

    One per key at a time, machine-wide: the lock file is held by the probe process itself
    (inherited), so it is released exactly when that process ends, whoever started it. A second
    process finding it held waits for that answer in the cache instead of probing too. The probe
    outlives its starter if need be (a ``gpulayer run`` of a one-second job): it writes the
    cache, so the next start on this machine is answered from it. Waiting happens in a daemon
    thread, never in the event loop's executor, so a process that is done never waits for it.
    """

    def __init__(
        self, store: MachineCache, key: str, python: str = sys.executable, deadline: int = DEADLINE
    ) -> None:
        self.store = store
        self.key = key
        self.python = python
        self.deadline = deadline
        self.pid: int | None = None  # the probe process, when this one started it
        self._answer: WorkerCapabilities | None = None
        self._finished = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._mutex = threading.Lock()

    def start(self) -> None:
        """Start the probe (or find the one running); its answer arrives in a thread."""
        fd = self._lock()
        if fd is None:  # another process probes: wait for its answer in the cache
            threading.Thread(
                target=self._wait_for_other, name="gpulayer-probe", daemon=True
            ).start()
            return
        try:
            proc = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    PROBE_MODULE,
                    "--cache-dir",
                    str(self.store.folder),
                    "--key",
                    self.key,
                    "--deadline",
                    str(self.deadline),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=probe_env(),
                pass_fds=(fd,),
                start_new_session=True,  # not stopped with its starter's terminal or group
            )
        except OSError as exc:
            log.warning("could not start the background probe: %s", exc)
            self._finish(None)
            return
        finally:
            os.close(fd)  # the probe process holds the lock from here on
        self.pid = proc.pid
        threading.Thread(
            target=self._read, args=(proc,), name="gpulayer-probe", daemon=True
        ).start()

    def _lock(self) -> int | None:
        """The lock's fd, taken; None when another process holds it (or it cannot be made)."""
        try:
            self.store.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.store.lock_path(self.key), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        out, _ = proc.communicate()  # closes the pipe too
        lines = out.decode(errors="replace").strip().splitlines()
        answer: WorkerCapabilities | None = None
        with contextlib.suppress(ValidationError, IndexError):
            answer = WorkerCapabilities.model_validate_json(lines[-1])
        if answer is not None and any(e.startswith("probe:") for e in answer.probe_errors):
            answer = None  # a probe that timed out or crashed is no answer
        self._finish(answer)

    def _wait_for_other(self) -> None:
        answer: WorkerCapabilities | None = None
        try:
            fd = os.open(self.store.lock_path(self.key), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # bounded: that probe stops at its deadline
            finally:
                os.close(fd)
            hit = self.store.read(self.key)
            if hit is not None:
                with contextlib.suppress(ValidationError):
                    answer = WorkerCapabilities.model_validate(hit)
        except OSError:
            pass
        self._finish(answer)

    def _finish(self, answer: WorkerCapabilities | None) -> None:
        with self._mutex:
            self._answer, self._finished = answer, True
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut)

    async def result(self) -> WorkerCapabilities | None:
        """The full probe's answer, with this host's facts; None if it failed."""
        fut: asyncio.Future[None] | None = None
        with self._mutex:
            if not self._finished:
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                self._waiters.append((loop, fut))
        if fut is not None:
            await fut
        if self._answer is None:
            return None
        return self._answer.model_copy(update={"host": read_host()})


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
