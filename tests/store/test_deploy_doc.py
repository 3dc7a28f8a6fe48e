"""Every command of docs/deploy.md runs, read from the page, so the page and the code cannot drift
(as tests/torch/test_migrating.py does for docs/migrating.md).

Two "machines" are two homes and two ``/etc/gpulayer`` folders under the test's folder, on one
real PostgreSQL database; only names and places are rewritten (``REWRITES``): the example hosts
become 127.0.0.1 on free ports, ``/etc/gpulayer`` and ``/shared`` scratch folders, ``glt_…``
placeholders the tokens the previous commands printed, and ``scp`` to the second machine a copy.
The certificate is issued by a test CA that the clients are told to trust (``GPULAYER_CA_CERT``),
standing in for a CA the machines already trust. Then: §2 brings up the leader and the standby
(with the key file copied as the page says) and asks both for health and readiness, §3 adds the
people, §4 joins a worker with both URLs, and the leader is killed: the standby takes over.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.security import CA_CERT_ENV
from gpulayer_kernel.testing import wait_until
from gpulayer_kernel.testing.postgres import PostgresServer, free_port

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```console\n(.*?)^```$", re.M | re.S)


def section(number: int) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def commands(number: int) -> list[tuple[str, list[str]]]:
    """(command, the output the page shows) for each ``$`` line of section ``number``."""
    found: list[tuple[str, list[str]]] = []
    for block in BLOCK.findall(section(number)):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            assert lines[i].startswith("$ "), f"§{number}: output before a command: {lines[i]}"
            cmd = lines[i][2:]
            while cmd.endswith("\\"):
                i += 1
                cmd = cmd[:-1] + lines[i].strip()
            i += 1
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i])
                i += 1
            found.append((" ".join(cmd.split()), out))
    return found


class Site:
    """The two machines, the database and the tokens: what the page's commands are run with."""

    def __init__(self, tmp: Path, db: str) -> None:
        self.tmp, self.db = tmp, db
        self.ports = {1: free_port(), 2: free_port()}
        self.tokens: dict[str, str] = {}
        self.exports: dict[str, str] = {}  # the admin's shell (machine 0)
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, Path] = {}
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(tmp / "ca.pem"))  # §4's --ca-cert ca.pem
        for m in (1, 2):
            etc = self.etc(m)
            etc.mkdir(parents=True, mode=0o700)
            cert.private_key_and_cert_chain_pem.write_to_path(str(etc / "cert.pem"))
            cert.private_key_pem.write_to_path(str(etc / "key.pem"))

    def etc(self, m: int) -> Path:
        return self.tmp / f"m{m}" / "etc" / "gpulayer"

    def url(self, m: int) -> str:
        return f"https://127.0.0.1:{self.ports[m]}"

    def rewrite(self, cmd: str, m: int) -> str:
        """The page's command as machine ``m`` runs it here (REWRITES)."""
        for n in (1, 2):
            cmd = cmd.replace(f"https://gpu-head-{n}.example:8470", self.url(n))
        if m in self.ports:
            cmd = cmd.replace("--port 8470", f"--port {self.ports[m]}")
        cmd = cmd.replace("/etc/gpulayer/", f"{self.etc(m)}/")
        cmd = cmd.replace("/shared/", f"{self.tmp}/shared/")
        for placeholder, token in self.tokens.items():
            cmd = cmd.replace(placeholder, token)
        return cmd

    def env(self, m: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        return env | {
            "PATH": f"{BIN}:{env.get('PATH', '')}",
            "GPULAYER_HOME": str(self.tmp / f"m{m}" / "home"),  # m0: the admin's, m3: a worker's
            "GL_DB": self.db,
            CA_CERT_ENV: str(self.tmp / "ca.pem"),
            **(self.exports if m == 0 else {}),
        }

    def run(self, cmd: str, m: int = 1) -> str:
        r = subprocess.run(
            ["bash", "-c", cmd], capture_output=True, text=True, timeout=60, env=self.env(m),
            cwd=self.tmp,
        )  # fmt: skip
        assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def start(self, name: str, cmd: str, m: int) -> None:
        self.logs[name] = self.tmp / f"{name}.log"
        with self.logs[name].open("w") as out:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                ["bash", "-c", cmd], stdout=out, stderr=subprocess.STDOUT, text=True,
                env=self.env(m), cwd=self.tmp, start_new_session=True,
            )  # fmt: skip

    def output(self, name: str) -> str:
        return self.logs[name].read_text()

    def wait_for(self, name: str, text: str, timeout: float = 60) -> None:
        def seen() -> bool:
            assert self.procs[name].poll() is None, f"{name} exited:\n{self.output(name)}"
            return text in self.output(name)

        wait_until(seen, timeout=timeout, what=f"{name}: {text}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def same_json(got: str, shown: str) -> bool:
    """``got`` is the JSON the page shows, where the page's ``"..."`` stands for any value."""
    want: dict[str, Any] = json.loads(shown)
    have: dict[str, Any] = json.loads(got)
    return set(have) == set(want) and all(v == "..." or have[k] == v for k, v in want.items())


def test_the_page_has_the_commands_it_promises() -> None:
    first = [c.split()[:2] for c, _ in commands(2)]
    assert (
        first
        == [["gpulayer", "serve"], ["scp", "/etc/gpulayer/secrets.key"]] + [["curl", "-s"]] * 3
    )
    assert "--secrets-key /etc/gpulayer/secrets.key" in commands(2)[0][0]
    assert len(commands(3)) == 7 and len(commands(4)) == 2


@pytest.mark.skipif(not (BIN / "gpulayer").exists(), reason="no gpulayer script beside python")
def test_the_deploy_page_runs(gl_postgres: PostgresServer, tmp_path: Path) -> None:
    pytest.importorskip("trustme")
    if shutil.which("curl") is None:  # install.sh --dev installs it
        (pytest.fail if os.environ.get("CI") else pytest.skip)("curl is not installed")
    site = Site(tmp_path, gl_postgres.create_database())
    try:
        (serve, serve_out), (scp, _), *curls = commands(2)
        site.start("m1", site.rewrite(serve, 1), 1)
        for line in serve_out:  # standby, then the admin token, then ready
            site.wait_for("m1", line.split(" on ")[0].split("(shown")[0])
        site.tokens["glt_c_..."] = re.findall(r"glt_c_\S+", site.output("m1"))[0]
        assert (site.etc(1) / "secrets.key").stat().st_mode & 0o777 == 0o600

        # scp SRC gpu-head-2.example:DST: the copy from machine 1 to machine 2.
        _, src, dst = scp.split()
        assert dst.startswith("gpu-head-2.example:")
        shutil.copy(site.rewrite(src, 1), site.rewrite(dst.split(":", 1)[1], 2))
        second = serve.replace("gpu-head-1.example", "gpu-head-2.example")
        site.start("m2", site.rewrite(second, 2), 2)
        site.wait_for("m2", "gpulayer serve: standby on")

        for cmd, shown in curls:
            got = site.run(site.rewrite(cmd, 1))
            assert (same_json(got, shown[0]) if shown[0].startswith("{") else got.split() ==
                    shown), (cmd, got, shown)  # fmt: skip

        # §3 and §4 from the admin's own machine (machine 0: a home with no server in it).
        script = "set -e\n" + "\n".join(site.rewrite(c, 0) for c, _ in commands(3))
        people = site.run(script, 0)
        assert re.search(r"glt_c_\S+", people), people  # alice's token
        for cmd, _ in commands(3):  # the admin's shell keeps §3's exports for §4
            if cmd.startswith("export "):
                name, value = site.rewrite(cmd, 0)[7:].split("#")[0].strip().split("=", 1)
                site.exports[name] = value

        (join, _), (worker, _) = commands(4)
        site.tokens["glt_j_..."] = site.run(site.rewrite(join, 0), 0).split()[-1]
        site.start("worker", site.rewrite(worker, 0), 3)  # a GPU machine of its own
        urls = f"{site.url(1)},{site.url(2)}"
        token = site.tokens["glt_c_..."]
        with Client(urls, token, ca_cert=str(tmp_path / "ca.pem")) as admin:

            def joined() -> bool:
                assert site.procs["worker"].poll() is None, site.output("worker")
                return any(w.live for w in admin.workers())

            wait_until(joined, timeout=60, what="the worker joins")
            os.killpg(site.procs["m1"].pid, signal.SIGKILL)  # the leader dies
            site.wait_for("m2", "gpulayer serve: ready on", timeout=60)
            wait_until(joined, timeout=60, what="the worker on the new leader")
            assert site.url(2) in admin.servers.url
    finally:
        site.close()
