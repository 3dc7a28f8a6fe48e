"""A real one-machine Slurm 22.05 for tests and benchmarks: munged, slurmctld, two slurmd nodes.

    with SlurmCluster(tmp / "slurm") as slurm:
        env = {**os.environ, **slurm.env()}      # SLURM_CONF for sbatch, squeue, sinfo, scancel
        subprocess.run(["sbatch", "--wrap", "true"], env=env)

Everything lives under one directory (state, spool, logs, the munge key and socket) and on ports
chosen at run time, so two runs on one machine never collide. GPUs without hardware: each node
has two "GPUs" whose device files are links to ``/dev/null`` (Slurm 22.05 drops file-less GPU
GRES). Stopping kills slurmd before slurmctld (slurmd takes ~10 s to stop once its controller is
gone) and munged last, each by the pid it was started with. Needs root (Slurm runs as root here)
and Debian's ``slurmctld slurmd slurm-client munge``: ``missing()`` says what is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from .processes import Daemon, stop_popen
from .reaper import register_root

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel")
NODES = ("n1", "n2")
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2


def missing() -> str | None:
    """Why a SlurmCluster cannot start here (None: it can)."""
    absent = [
        b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()
    ]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): install Debian's slurmctld "
            "slurmd slurm-client munge (install.sh --dev does, as root)"
        )
    if os.geteuid() != 0:
        return "a test Slurm runs its daemons as root"
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster(Daemon):
    """munged + slurmctld + slurmd ``n1``, ``n2`` (2 CPUs, 2 GPUs each) in partition ``gpu``."""

    def __init__(self, root: Path | str, *, partition: str = "gpu") -> None:
        self.root = Path(root)
        self.partition = partition
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._registered: Path | None = None  # the test reaper's note of this cluster's folder

    def env(self) -> dict[str, str]:
        """What Slurm's commands need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # -- configuration ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "dev", "log", *(f"spool-{n}" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for i in range(GPUS_PER_NODE):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():
                dev.symlink_to("/dev/null")  # GRES needs a device file; there is no GPU
        ctld, *node_ports = free_ports(1 + len(NODES))
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} "
            f"CPUs={CPUS_PER_NODE} RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for n, p in zip(NODES, node_ports, strict=True)
        )
        self.conf.write_text(
            f"""ClusterName=gltest
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={node_ports[0]}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
KillWait=5
{nodes}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (r / "gres.conf").write_text(
            "AutoDetect=off\n"
            + "".join(
                f"NodeName={n} Name=gpu File={r}/dev/gpu[0-{GPUS_PER_NODE - 1}]\n" for n in NODES
            )
        )

    # -- life ------------------------------------------------------------------------------------

    def _start(self, key: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{key}.out").open("ab")
        env = {**os.environ, **self.env()}
        self._procs[key] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        log.close()

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        why = missing()
        if why is not None:
            raise RuntimeError(why)
        self._write_config()
        # slurmstepd clears its environment and leaves slurmd: the test reaper finds a killed
        # run's by the files it holds here (testing/reaper.py).
        self._registered = register_root(self.root)
        m = self.root / "munge"
        self._start(
            "munged",
            [
                _bin("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={m}/munge.key",
                f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), 10, "munged's socket")
        self._start("slurmctld", [_bin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for n in NODES:
            self._start(f"slurmd-{n}", [_bin("slurmd"), "-D", "-f", str(self.conf), "-N", n])
        self._wait(self._nodes_idle, timeout, "both slurmd nodes to be idle")
        return self

    def _nodes_idle(self) -> bool:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n, "").startswith("idle") for n in NODES)

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(
            list(argv),
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for key, p in self._procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{key} exited ({p.returncode}):\n{self.logs()}")
            if ok():  # type: ignore[operator]
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm: no {what} after {timeout}s:\n{self.logs()}")
            time.sleep(0.1)  # a fixture starting daemons, not a hot path

    def logs(self) -> str:
        """The tail of every daemon's log, to explain a failure."""
        out = []
        for f in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            with contextlib.suppress(OSError):
                out.append(f"== {f.name}\n" + f.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def stop(self) -> None:
        """Stop slurmd, then slurmctld, then munged; each by its pid, SIGKILL after a wait."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            # Jobs first: their slurmstepd processes outlive slurmd otherwise.
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.run("scancel", "--full", "--user", "root", timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.run("squeue", "-h").stdout.strip():
                    time.sleep(0.2)
        order = [k for k in self._procs if k.startswith("slurmd")] + ["slurmctld", "munged"]
        for key in order:
            p = self._procs.pop(key, None)
            if p is not None:
                stop_popen(p)
        if self._registered is not None:
            self._registered.unlink(missing_ok=True)
            self._registered = None

    def provider_toml(self, *, idle_timeout: float = 2, simulate: bool = True) -> str:
        """A ``providers.toml`` whose Slurm provider launches workers on this cluster."""
        return f"""
[autoscale]
idle_timeout = {idle_timeout}
reconcile_every = 0.25
boot_timeout = 60

[providers.slurm]
kind = "slurm"
slurm_conf = "{self.conf}"
gpulayer = ["{sys.executable}", "-m", "gpulayer_kernel.cli"]
time_limit = "10"
boot_seconds = 5

[providers.slurm.partitions.{self.partition}]
price_per_gpu_hour = 2.10
gpu_kind = "a100"
gpu_memory_gb = 80
simulate = {"true" if simulate else "false"}
"""
