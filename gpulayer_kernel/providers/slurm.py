"""``SlurmProvider``: workers as Slurm batch jobs, on the cluster a team already has.

    offers     ``sinfo --json``: per configured partition, its nodes' GPU GRES (``gpu:2``,
               ``gpu:a100:4``) become offers of 1..N GPUs at the partition's price per GPU-hour
    launch     ``sbatch --parsable --job-name gpulayer-<owner>-<instance> --partition P
               --gres=gpu:N --time T --wrap "exec gpulayer worker --server URL ..."``; the
               single-use instance token reaches the job through sbatch's environment, never argv
    watch      ``squeue --json``: the batch jobs named with this control plane's tag
    end        ``scancel --name gpulayer-<owner>-<instance> <job id>``: SIGTERM to the worker, which
               leaves the control plane; the name makes Slurm cancel only this cluster's job

The commands run with ``SLURM_CONF`` from the config and a small environment (no variable of the
control plane's own leaks into a batch job). ``pyslurm`` has no 22.05 build; the commands are the
stable interface. Every call is bounded by the autoscaler's timeout and a failure is a
``ProviderError`` carrying Slurm's own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from typing import Any

from ..contracts import Offer
from ..errors import ProviderError
from .base import (
    TOKEN_ENV,
    Census,
    Check,
    LaunchSpec,
    Reported,
    ReportedState,
    shell_line,
    worker_argv,
)
from .config import SlurmPartition, SlurmSettings, no_price, slurm_hours

GIB = 1 << 30
_GRES = re.compile(r"^gpu(?::(?P<type>[A-Za-z0-9_.-]+))?:(?P<count>\d+)")
# squeue's job states, as the autoscaler reads them.
_STATES: dict[str, ReportedState] = {
    "PENDING": "booting",
    "CONFIGURING": "booting",
    "REQUEUED": "booting",
    "RESIZING": "booting",
    "RUNNING": "running",
    "SUSPENDED": "running",
    "COMPLETING": "running",  # ending: its final state (CANCELLED, COMPLETED...) follows
    "COMPLETED": "ended",
    "CANCELLED": "ended",
    "TIMEOUT": "ended",
    "DEADLINE": "ended",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "PREEMPTED": "preempted",
}
_PASS_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR")


class SlurmProvider:
    """Launches ``gpulayer worker`` batch jobs on a Slurm cluster (see the module docstring)."""

    kind = "slurm"

    def __init__(self, settings: SlurmSettings, *, owner: str, timeout: float = 30.0) -> None:
        self.settings = settings
        self.name = settings.name
        self.max_instances = settings.max_instances
        self.owner = owner  # the cluster id: tells this cluster's batch jobs from another's
        self.timeout = timeout

    def job_name(self, instance_id: str) -> str:
        return f"gpulayer-{self.owner}-{instance_id}"

    def _instance_of(self, job_name: str) -> str | None:
        prefix = f"gpulayer-{self.owner}-"
        if not job_name.startswith(prefix):
            return None
        rest = job_name[len(prefix) :]
        return rest if re.fullmatch(r"[0-9a-f]{12}", rest) else None

    # -- commands --------------------------------------------------------------------------------

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        if self.settings.slurm_conf:
            env["SLURM_CONF"] = os.path.expanduser(self.settings.slurm_conf)
        return {**env, **(extra or {})}

    async def _run(self, *argv: str, env: dict[str, str] | None = None) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env or self._env(),
            )
        except FileNotFoundError:
            raise ProviderError(
                f"{self.name}: {argv[0]} is not installed here",
                hint="install Slurm's client commands (Debian: slurm-client) on the control "
                "plane's machine, or set slurm_conf to reach the cluster",
                details={"provider": self.name, "command": argv[0]},
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise ProviderError(
                f"{self.name}: {argv[0]} did not answer within {self.timeout:g}s",
                hint="is slurmctld up? (`sinfo` on this machine says)",
                details={"provider": self.name, "command": argv[0]},
            ) from None
        if proc.returncode != 0:
            words = (err or out).decode(errors="replace").strip()[-500:]
            raise ProviderError(
                f"{self.name}: {argv[0]} failed (exit {proc.returncode}): {words}",
                hint="Slurm's own message is above; `sinfo` and `squeue` show the cluster",
                details={"provider": self.name, "command": argv[0], "exit": proc.returncode},
            )
        return out.decode(errors="replace")

    async def _json(self, *argv: str) -> dict[str, Any]:
        text = await self._run(*argv)
        try:
            data = json.loads(text)
        except ValueError:
            raise ProviderError(
                f"{self.name}: {argv[0]} --json answered something that is not JSON",
                hint="Slurm 21.08 or newer is needed (`--json`)",
            ) from None
        if not isinstance(data, dict):
            raise ProviderError(f"{self.name}: {argv[0]} --json answered a {type(data).__name__}")
        return data

    # -- the protocol ----------------------------------------------------------------------------

    async def offers(self) -> list[Offer]:
        data = await self._json("sinfo", "--json")
        nodes = [n for n in data.get("nodes", []) if isinstance(n, dict)]
        out: list[Offer] = []
        for part_name, part in sorted(self.settings.partitions.items()):
            members = [n for n in nodes if part_name in (n.get("partitions") or [])]
            shapes: dict[tuple[str, int], int] = {}  # (gres type, gpus) -> node cpus (least)
            for n in members:
                m = _GRES.match(str(n.get("gres") or ""))
                key = (m.group("type") or "", int(m.group("count"))) if m else ("", 0)
                cpus = int(n.get("cpus") or 1)
                shapes[key] = min(shapes.get(key, cpus), cpus)
            for (gres_type, count), cpus in sorted(shapes.items()):
                out.extend(self._offers_of(part_name, part, gres_type, count, cpus))
        return out

    def _offers_of(
        self, part_name: str, part: SlurmPartition, gres_type: str, count: int, cpus: int
    ) -> list[Offer]:
        where = f"providers.{self.name}.partitions.{part_name}"
        if count == 0:
            if part.price_per_hour is None:
                raise no_price(f"{where}.price_per_hour", "a partition without GPUs")
            return [self._offer(part_name, part_name, part, "", 0, cpus, part.price_per_hour)]
        if part.price_per_gpu_hour is None:
            raise no_price(f"{where}.price_per_gpu_hour", f"partition {part_name} has GPUs")
        kind = (part.gpu_kind or gres_type or "gpu").lower()
        price = part.price_per_gpu_hour
        return [
            self._offer(f"{part_name}-{k}gpu", part_name, part, kind, k, cpus, k * price)
            for k in range(1, count + 1)
        ]

    def _offer(
        self,
        name: str,
        part_name: str,
        part: SlurmPartition,
        kind: str,
        gpus: int,
        cpus: int,
        price: float,
    ) -> Offer:
        return Offer(
            provider=self.name,
            name=name,
            region=self.settings.region,
            gpus=gpus,
            gpu_kind=kind,
            gpu_memory=int(part.gpu_memory_gb * GIB) if gpus else 0,
            cpus=cpus,
            labels={**part.labels, "slurm.partition": part_name},
            price_per_hour=price,
            boot_seconds=self.settings.boot_seconds,
            max_hours=slurm_hours(self.settings.time_limit),
            simulated=part.simulate,
        )

    def where(self, offer: Offer, instance_id: str) -> str | None:
        return None  # found by its tag (the job name) until the launch answers with its id

    async def launch(self, offer: Offer, instance_token: str, how: LaunchSpec) -> str:
        s = self.settings
        partition = offer.labels.get("slurm.partition", offer.name)
        work = f"{s.work_dir.rstrip('/')}/{how.instance_id}" if s.work_dir else None
        argv = worker_argv(list(s.gpulayer), offer, how, work_dir=work)
        script = f"exec {shell_line(argv)}"
        if work:
            script = f"mkdir -p {work} && export GPULAYER_HOME={work}/home && {script}"
        cmd = [
            "sbatch",
            "--parsable",
            f"--job-name={self.job_name(how.instance_id)}",
            f"--partition={partition}",
            f"--time={s.time_limit}",
            f"--output={s.output_path}",  # providers.toml's output, or beside the work dir
            "--export=ALL",  # the small environment below, token included (never argv)
        ]
        if offer.gpus:
            cmd.append(f"--gres=gpu:{offer.gpus}")
        cmd += [*s.extra_args, "--wrap", script]
        out = await self._run(*cmd, env=self._env({TOKEN_ENV: instance_token}))
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise ProviderError(f"{self.name}: sbatch answered {out.strip()!r}, not a job id")
        return job_id

    async def terminate(self, instance_id: str, external_id: str | None) -> None:
        # Always by its name, this cluster's tag: with a job id too, Slurm cancels the job only
        # if its name matches, so a server never ends a batch job another cluster launched (a
        # restored copy of the database names the live cluster's job ids).
        argv = ["scancel", f"--name={self.job_name(instance_id)}"] if instance_id else ["scancel"]
        if external_id:
            argv.append(external_id)  # without a name: a stray our listing found by our tag
        if len(argv) == 1:
            return
        try:
            await self._run(*argv)
        except ProviderError as exc:
            # Ending an ended job is no error: terminate is idempotent.
            if not re.search(r"already|Invalid job id|completed", exc.message, re.IGNORECASE):
                raise

    async def instances(self) -> Census:
        data = await self._json("squeue", "--json")
        out = []
        for job in data.get("jobs", []):
            name = str(job.get("name", ""))
            if not name.startswith(f"gpulayer-{self.owner}-"):
                continue
            raw = job.get("job_state", "")
            state_name = (raw[0] if isinstance(raw, list) and raw else str(raw)).upper()
            state = _STATES.get(state_name, "running")
            reason = str(job.get("state_reason") or "")
            detail = f"batch job {job.get('job_id')} {state_name}" + (
                f" ({reason})" if reason and reason != "None" else ""
            )
            out.append(Reported(str(job.get("job_id")), self._instance_of(name), state, detail))
        return Census(tuple(out))

    async def check(self) -> Check:
        offers = await self.offers()
        data = await self._json("sinfo", "--json")
        version = data.get("meta", {}).get("Slurm", {}).get("release", "?")
        seen = {p for n in data.get("nodes", []) for p in (n.get("partitions") or [])}
        absent = sorted(set(self.settings.partitions) - seen)
        detail = f"Slurm {version}: {len(offers)} offer(s) from " + ", ".join(
            sorted(set(self.settings.partitions) & seen) or ["no partition"]
        )
        if absent:
            return Check(False, f"{detail}; partition(s) not on the cluster: {', '.join(absent)}")
        return Check(True, detail, tuple(offers))

    async def close(self) -> None:
        return None
