"""A real OpenSSH server for tests and benchmarks, on a port chosen at run time.

    with SSHServer(tmp / "sshd") as sshd:              # 127.0.0.1
        sshd.known_hosts_line()                        # "[127.0.0.1]:40123 ssh-ed25519 AAAA..."
        sshd.client_key                                # a private key it accepts (root)

    with SSHServer(tmp / "b", address="10.214.2.2", netns="gl-b-123"):   # inside a netns

Its host key, the client key it accepts, its config, pid and log all live under one directory;
it logs in root with that key only (no passwords, no PAM). Stopped by its pid. Needs root and
Debian's ``openssh-server``: ``missing()`` says what is absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from .processes import Daemon, kill_homes_under, stop_popen
from .slurm import free_ports

SSHD = "/usr/sbin/sshd"


def missing() -> str | None:
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        return "OpenSSH is not installed: install Debian's openssh-server (install.sh --dev does)"
    if os.geteuid() != 0:
        return "a test sshd logs in root: it needs root"
    return None


def keygen(path: Path) -> str:
    """A new ed25519 key pair at ``path`` (and ``path``.pub); returns the public line."""
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    return Path(f"{path}.pub").read_text().strip()


class SSHServer(Daemon):
    """``sshd -D`` with its own host key, config and one accepted client key."""

    def __init__(
        self,
        root: Path | str,
        *,
        address: str = "127.0.0.1",
        port: int | None = None,
        netns: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.env = dict(env or {})  # set in every session (sshd's SetEnv)
        self.address = address
        self.port = port or free_ports(1)[0]
        self.netns = netns
        self.host_key = self.root / "ssh_host_ed25519_key"
        self.client_key = self.root / "client_key"
        self._proc: subprocess.Popen[bytes] | None = None

    def known_hosts_line(self) -> str:
        """This server's line for a known_hosts file."""
        kind, key = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {key}"

    def start(self, timeout: float = 15.0) -> SSHServer:
        why = missing()
        if why is not None:
            raise RuntimeError(why)
        self.root.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key)
        (self.root / "authorized_keys").write_text(keygen(self.client_key) + "\n")
        conf = self.root / "sshd_config"
        conf.write_text(
            f"""Port {self.port}
ListenAddress {self.address}
HostKey {self.host_key}
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.root}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
"""
            + "".join(f"SetEnv {k}={v}\n" for k, v in self.env.items())
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation dir
        argv = [SSHD, "-D", "-e", "-f", str(conf)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        with (self.root / "sshd.log").open("ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited ({self._proc.returncode}): {self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sshd not listening after {timeout}s: {self.log()}")
            time.sleep(0.05)  # a fixture starting a daemon, not a hot path
        return self

    def _listening(self) -> bool:
        if self.netns:
            r = subprocess.run(
                ["ip", "netns", "exec", self.netns, "ss", "-ltn", f"sport = :{self.port}"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return f":{self.port}" in r.stdout
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((self.address, self.port)) == 0

    def log(self) -> str:
        try:
            return (self.root / "sshd.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop sshd, and every process started through it that still runs with a home under
        this server's directory (a worker it launched: ``setsid`` detached it from sshd)."""
        kill_homes_under(self.root)
        if self._proc is not None:
            stop_popen(self._proc, 10)
        self._proc = None
