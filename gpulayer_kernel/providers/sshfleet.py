"""``SSHFleetProvider``: bring-your-own machines, listed in the config, reached over SSH (asyncssh).

Each host is one offer of capacity 1 (its GPUs at its own rate: owned hardware has a price too,
so estimates and budgets mean something). Launching on a host:

1. connect, verifying its host key against the config's ``known_hosts`` (no blind trust: an
   unknown key and a *changed* key are both refused, saying which, and how to check it);
2. read the GPUlayer version in its venv; when it differs from ours (or is missing), run the
   host's ``install`` command (default: this control plane's own wheel, copied over the
   connection, ``python3 -m venv VENV && VENV/bin/pip install WHEEL``) and read it again;
3. write the single-use instance token to a 0600 file in the instance's directory, and start
   ``gpulayer worker`` under ``setsid`` (it reads the file, deletes it, and so never carries the
   token on a command line); its pid file names the instance.

The host is recorded before anything starts on it (``where``: the instance's external id is
the host's name until its worker's pid is known, ``host:pid`` after), so a control plane killed
mid-launch leaves a record that names the host. Scale-down marks the instance's directory ended
(a worker not started yet never starts), sends the worker SIGTERM (it leaves the control plane,
stopping its jobs), then SIGKILL after a grace. An instance with no host recorded is ended by
its tag on every host, as ``scancel --name`` does on Slurm. ``instances()`` lists the instance
directories of this control plane on every host and whether their worker runs; a host it cannot
reach is *unlisted*, never "gone".
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shlex
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts import Offer
from ..errors import ConfigInvalid, ProviderError
from .base import Census, Check, LaunchSpec, Reported, ReportedState, shell_line, worker_argv
from .config import SSHHost, SSHSettings, no_price

GIB = 1 << 30
STOP_GRACE = 15.0  # seconds a worker gets to leave (and stop its jobs) before SIGKILL


@dataclass(frozen=True, slots=True)
class Ran:
    """What one command on a host gave back.

    A host's shell may write to stderr on every start (pyenv's rehash, a motd, a warning in
    .bashrc), so only stdout is parsed (``out``); ``said`` holds both, for the person reading an
    error.
    """

    code: int
    out: str
    said: str


def local_version() -> str:
    try:
        return importlib.metadata.version("gpulayer")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0+unknown"


class SSHFleetProvider:
    """Starts and stops ``gpulayer worker`` on hosts listed in the config (module docstring)."""

    kind = "ssh"

    def __init__(self, settings: SSHSettings, *, owner: str, timeout: float = 60.0) -> None:
        self.settings = settings
        self.name = settings.name
        self.max_instances = settings.max_instances
        self.owner = owner
        self.timeout = timeout
        self.version = local_version()
        self._hosts = {h.name: h for h in settings.hosts}

    def _dir(self, work: str, instance_id: str) -> str:
        return f"{work.rstrip('/')}/gpulayer-{self.owner}-{instance_id}"

    async def _paths(self, conn: Any, host: SSHHost) -> tuple[str, str]:
        """The host's venv and work directory with ``~`` expanded there."""
        home = (await self._sh(conn, 'printf %s "$HOME"')).out.strip() or "/"

        def expand(path: str) -> str:
            return home + path[1:] if path == "~" or path.startswith("~/") else path

        return expand(host.venv), expand(host.work_dir)

    # -- connections -----------------------------------------------------------------------------

    async def _connect(self, host: SSHHost) -> Any:
        asyncssh = _asyncssh()

        where = f"{host.address}:{host.port}"
        known = os.path.expanduser(self.settings.known_hosts)
        if not os.path.exists(known):
            raise ConfigInvalid(
                f"providers.toml: providers.{self.name}.known_hosts: {known} does not exist",
                hint="create it with the hosts' keys, checked out of band (ssh-keyscan -p PORT "
                "HOST prints them; compare the fingerprints) — GPUlayer never trusts blindly",
                details={"field": f"providers.{self.name}.known_hosts"},
            )
        keys = [os.path.expanduser(host.key)] if host.key else ()
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    host.address,
                    port=host.port,
                    username=host.user,
                    client_keys=keys or None,
                    known_hosts=known,
                    agent_path=None if keys else (),
                ),
                self.settings.connect_timeout,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._host_key_error(host, known, exc) from None
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise ProviderError(
                f"{self.name}: cannot reach host {host.name} ({where}): "
                f"{exc or type(exc).__name__}",
                hint="is sshd running there, the address right, the key authorised?",
                details={"provider": self.name, "host": host.name},
            ) from None

    def _host_key_error(self, host: SSHHost, known: str, exc: Exception) -> ProviderError:
        asyncssh = _asyncssh()

        entry = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
        try:
            listed = bool(asyncssh.read_known_hosts(known).match(host.address, "", host.port)[0])
        except (OSError, ValueError, asyncssh.Error):
            listed = False
        if listed:
            why = (
                f"host {host.name} ({entry}) presented a host key that is not the one in "
                f"{known}: it changed, so the connection was refused"
            )
            hint = (
                "if the host was reinstalled, check its new key out of band (ssh-keyscan, "
                "compare fingerprints) and replace its line in known_hosts; otherwise "
                "someone may be in the middle"
            )
        else:
            why = f"host {host.name} ({entry}) has no key in {known}: refused (no blind trust)"
            hint = (
                "add its key after checking the fingerprint: "
                f"ssh-keyscan -p {host.port} {host.address}"
            )
        return ProviderError(
            f"{self.name}: {why} ({exc})",
            hint=hint,
            details={"provider": self.name, "host": host.name},
            code="host_key_refused",
        )

    async def _sh(
        self, conn: Any, command: str, *, stdin: str | None = None, check: bool = True
    ) -> Ran:
        result = await asyncio.wait_for(conn.run(command, input=stdin, check=False), self.timeout)
        out = result.stdout or ""
        ran = Ran(
            int(result.exit_status if result.exit_status is not None else 255),
            out,
            f"{out}{result.stderr or ''}",
        )
        if check and ran.code != 0:
            raise ProviderError(
                f"{self.name}: a command failed on the host (exit {ran.code}): "
                f"{ran.said.strip()[-400:]}",
                hint="the host's own words are above",
                details={"provider": self.name, "exit": ran.code},
            )
        return ran

    # -- the protocol ----------------------------------------------------------------------------

    async def offers(self) -> list[Offer]:
        return [self._offer(i, h) for i, h in enumerate(self.settings.hosts)]

    def _offer(self, i: int, h: SSHHost) -> Offer:
        where = f"providers.{self.name}.hosts[{i}]"
        if h.gpus and h.price_per_gpu_hour is None:
            raise no_price(f"{where}.price_per_gpu_hour", f"host {h.name} has GPUs")
        if not h.gpus and h.price_per_hour is None:
            raise no_price(f"{where}.price_per_hour", f"host {h.name} has no GPUs")
        price = h.gpus * (h.price_per_gpu_hour or 0.0) if h.gpus else (h.price_per_hour or 0.0)
        return Offer(
            provider=self.name,
            name=h.name,
            region=self.settings.region,
            gpus=h.gpus,
            gpu_kind=h.gpu_kind.lower() if h.gpus else "",
            gpu_memory=int(h.gpu_memory_gb * GIB) if h.gpus else 0,
            cpus=h.cpus,
            labels={**h.labels, "ssh.host": h.name},
            price_per_hour=price,
            boot_seconds=self.settings.boot_seconds,
            simulated=h.simulate,
            capacity=1,
        )

    async def launch(self, offer: Offer, instance_token: str, how: LaunchSpec) -> str:
        host = self._host(offer.name)
        conn = await self._connect(host)
        async with conn:
            venv, work = await self._paths(conn, host)
            await self._ensure_gpulayer(conn, host, venv, work)
            d = self._dir(work, how.instance_id)
            spec = LaunchSpec(
                how.instance_id,
                how.worker_name,
                host.server_url or how.server_url,
                how.max_seconds,
                host.ca_cert or how.ca_cert,
            )
            argv = worker_argv([f"{venv}/bin/gpulayer"], offer, spec, work_dir=f"{d}/work")
            qd = shlex.quote(d)
            await self._sh(
                conn, f"mkdir -p {qd} && umask 077 && cat > {qd}/token", stdin=instance_token
            )
            inner = (
                "GPULAYER_JOIN_TOKEN=$(cat token) && rm -f token && export GPULAYER_JOIN_TOKEN "
                f"&& export GPULAYER_HOME={qd}/home GPULAYER_INSTANCE={how.instance_id} "
                # The pid first, then the end mark: a stop between the two sees the pid (and
                # kills this shell, which becomes the worker) or the worker sees the mark.
                f"&& echo $$ > worker.pid && [ ! -e ended ] && exec {shell_line(argv)}"
            )
            start = (
                # setsid -f: the worker forks away at once, holding none of this channel's
                # descriptors (else the channel, and this call, would last as long as it).
                f"cd {qd} || exit 1; setsid -f sh -c {shlex.quote(inner)} "
                "> worker.log 2>&1 < /dev/null; "
                f"for i in $(seq 50); do [ -s {qd}/worker.pid ] && break; sleep 0.1; done; "
                f"cat {qd}/worker.pid"
            )
            ran = await self._sh(conn, start)
        pid = ran.out.strip().splitlines()[-1] if ran.out.strip() else ""
        if not pid.isdigit():
            raise ProviderError(
                f"{self.name}: the worker on {host.name} did not start: {ran.said[-300:]}"
            )
        return f"{host.name}:{pid}"

    async def _version(self, conn: Any, venv: str) -> str | None:
        probe = (
            f"{shlex.quote(venv)}/bin/python -c "
            "'import importlib.metadata as m; print(m.version(\"gpulayer\"))'"
        )
        ran = await self._sh(conn, probe, check=False)
        return ran.out.strip() if ran.code == 0 else None

    async def _ensure_gpulayer(self, conn: Any, host: SSHHost, venv: str, work: str) -> None:
        """Our GPUlayer version in the host's venv: installed or updated when it differs.

        By default from the wheel this control plane runs (``selfwheel.py``), copied over the
        SSH connection: the versions match and the host needs no package index for GPUlayer.
        """
        if await self._version(conn, venv) == self.version:
            return
        wheel = "" if host.install else await self._put_wheel(conn, work)
        install = host.install or "{python} -m venv {venv} && {venv}/bin/pip install -q {wheel}"
        command = install.format(
            python=host.python, venv=shlex.quote(venv), version=self.version, wheel=wheel
        )
        ran = await self._sh(conn, command, check=False)
        if ran.code != 0:
            raise ProviderError(
                f"{self.name}: installing GPUlayer {self.version} on {host.name} failed "
                f"(exit {ran.code}): {ran.said.strip()[-400:]}",
                hint=f"fix providers.{self.name}.hosts install (or install it there by hand "
                f"into {venv})",
                details={"provider": self.name, "host": host.name},
            )
        found = await self._version(conn, venv)
        if found != self.version:
            raise ProviderError(
                f"{self.name}: after installing, {host.name} has GPUlayer "
                f"{found or 'missing'} in {venv}, not {self.version}",
                hint="check the host's install command",
            )

    async def _put_wheel(self, conn: Any, work: str) -> str:
        """Copy this control plane's wheel to ``work/dist`` on the host; its quoted path there."""
        from ..errors import NotFound
        from ..selfwheel import served_wheel

        try:
            wheel = await asyncio.to_thread(served_wheel)
        except NotFound as exc:
            raise ProviderError(
                f"{self.name}: no wheel to install GPUlayer from: {exc.message}",
                hint=f"{exc.hint}; or set providers.{self.name}.hosts install",
                details={"provider": self.name},
                code="dist_unavailable",
            ) from None
        data = await asyncio.to_thread(wheel.path.read_bytes)
        folder = shlex.quote(f"{work}/dist")
        path = shlex.quote(f"{work}/dist/{wheel.name}")
        command = f"mkdir -p {folder} && cat > {path}.part && mv -f {path}.part {path}"
        result = await asyncio.wait_for(
            conn.run(command, input=data, encoding=None, check=False), self.timeout
        )
        if result.exit_status != 0:
            said = (result.stderr or b"").decode(errors="replace").strip()[-400:]
            raise ProviderError(
                f"{self.name}: copying {wheel.name} to the host failed: {said}",
                hint="check the host's disk space and that its work folder is writable",
                details={"provider": self.name},
            )
        return path

    def where(self, offer: Offer, instance_id: str) -> str | None:
        """The external id recorded before launching: the host's name (its pid comes later)."""
        return self._host(offer.name).name

    async def terminate(self, instance_id: str, external_id: str | None) -> None:
        host = self._host_of(instance_id, external_id)
        if host is not None:
            await self._stop_on(host, instance_id)
            return
        # No host recorded (a record from before hosts were recorded first): end it by its tag
        # wherever it is, as `scancel --name` does. An unreachable host fails the call, so the
        # next round tries again.
        answers = await asyncio.gather(
            *(self._stop_on(h, instance_id) for h in self.settings.hosts), return_exceptions=True
        )
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:
            raise failed[0]

    async def _stop_on(self, host: SSHHost, instance_id: str) -> None:
        conn = await self._connect(host)
        async with conn:
            _, work = await self._paths(conn, host)
            qd = shlex.quote(self._dir(work, instance_id))
            await self._sh(conn, self._stop_script(qd))

    @staticmethod
    def _stop_script(qd: str) -> str:
        # Its directory stays (the worker's log), marked ended first: a worker not started yet
        # never starts (its start checks the mark after writing its pid), and listings skip it.
        return (
            f"[ -d {qd} ] || exit 0; touch {qd}/ended; "
            f"p=$(cat {qd}/worker.pid 2>/dev/null) || exit 0; "
            f"kill -TERM $p 2>/dev/null && for i in $(seq {int(STOP_GRACE * 10)}); do "
            "kill -0 $p 2>/dev/null || break; sleep 0.1; done; "
            "kill -KILL $p 2>/dev/null; exit 0"
        )

    async def instances(self) -> Census:
        """Every host listed at once; a host that cannot be reached is *unlisted*."""
        answers = await asyncio.gather(
            *(self._listed(h) for h in self.settings.hosts), return_exceptions=True
        )
        reported: list[Reported] = []
        unlisted: set[str] = set()
        errors: list[str] = []
        for i, (host, answer) in enumerate(zip(self.settings.hosts, answers, strict=True)):
            if isinstance(answer, BaseException):
                if not isinstance(answer, (ProviderError, ConfigInvalid)):
                    raise answer
                unlisted.add(self._offer(i, host).id)
                errors.append(answer.message)
            else:
                reported.extend(answer)
        return Census(tuple(reported), frozenset(unlisted), tuple(errors))

    async def _listed(self, host: SSHHost) -> list[Reported]:
        conn = await self._connect(host)
        prefix = f"gpulayer-{self.owner}-"
        async with conn:
            _, work = await self._paths(conn, host)
            out = (await self._sh(conn, self._list_script(work, prefix))).out
        return self._parse_listing(host, prefix, out)

    @staticmethod
    def _list_script(work: str, prefix: str) -> str:
        return (
            f"cd {shlex.quote(work)} 2>/dev/null || exit 0; "
            f'for d in {prefix}*; do [ -d "$d" ] && [ ! -e "$d/ended" ] || continue; '
            'p=$(cat "$d/worker.pid" '
            '2>/dev/null); if [ -z "$p" ]; then s=booting; p=-; '  # started, no pid yet
            "elif kill -0 $p 2>/dev/null; then s=running; "
            'else s=ended; fi; echo "$d $p $s"; done'
        )

    @staticmethod
    def _parse_listing(host: SSHHost, prefix: str, out: str) -> list[Reported]:
        found = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[0].startswith(prefix):
                continue
            name, state = parts[0], parts[-1]
            pid = parts[1] if len(parts) == 3 else "-"
            instance_id = name[len(prefix) :]
            said: ReportedState = "ended"
            if state == "booting":
                said = "booting"
            elif state == "running":
                said = "running"
            detail = f"worker pid {pid} on {host.name} {state}"
            if pid == "-":
                detail = f"worker on {host.name} starting"
            # A machine still starting has no pid yet, and so no external id to adopt.
            external = f"{host.name}:{pid}" if pid != "-" else ""
            found.append(Reported(external, instance_id, said, detail))
        return found

    async def check(self) -> Check:
        offers = await self.offers()
        lines = await asyncio.gather(*(self._check_host(h) for h in self.settings.hosts))
        ok = all(good for good, _ in lines)
        return Check(ok, "; ".join(line for _, line in lines), tuple(offers))

    async def _check_host(self, host: SSHHost) -> tuple[bool, str]:
        try:
            conn = await self._connect(host)
            async with conn:
                venv, _ = await self._paths(conn, host)
                found = await self._version(conn, venv)
        except (ProviderError, ConfigInvalid) as exc:
            return False, f"{host.name}: {exc.message}"
        have = f"GPUlayer {found}" if found else f"no GPUlayer in {venv} (installed at launch)"
        return True, f"{host.name}: reachable, host key verified, {have}"

    async def close(self) -> None:
        return None

    def _host_of(self, instance_id: str, external_id: str | None) -> SSHHost | None:
        """The host an instance was started on: its external id is ``host:pid``, or ``host``
        while its worker's pid is not known yet."""
        if not external_id:
            return None
        return self._hosts.get(external_id.rsplit(":", 1)[0] if ":" in external_id else external_id)

    def _host(self, name: str) -> SSHHost:
        host = self._hosts.get(name)
        if host is None:
            raise ProviderError(f"{self.name}: no host {name!r} in the config")
        return host

    @property
    def hosts(self) -> Sequence[SSHHost]:
        return self.settings.hosts


def _asyncssh() -> Any:
    """asyncssh, an optional dependency (only an SSH fleet needs it), imported quietly.

    cryptography 51 deprecated DSA, and asyncssh (2.24.1) names DSA's key classes when it is
    imported: a warning about the library's own internals, nothing a user can act on (GPUlayer
    never uses DSA keys). Other warnings still show.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DSA is deprecated", category=UserWarning)
        import asyncssh

    return asyncssh
