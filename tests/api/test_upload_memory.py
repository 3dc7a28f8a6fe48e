"""A real ``gpulayer serve`` keeps uploads out of its memory (issue 12, item 5: a 512 MiB PUT cost
the server 1 GiB). Measured as the server's peak resident size (``VmHWM``), which a short spike
cannot hide from."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel.bundles import MAX_BUNDLE_BYTES
from gpulayer_kernel.testing import ServeProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status"),
]

MIB = 1 << 20
PIECE = bytes(range(256)) * (MIB // 256)


def peak_rss(pid: int) -> int:
    """The process's peak resident set size, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM line")


def pieces(count: int, tail: bytes = b"") -> Iterator[bytes]:
    for _ in range(count):
        yield PIECE
    if tail:
        yield tail


def digest_of(count: int, tail: bytes = b"") -> str:
    h = hashlib.sha256()
    for piece in pieces(count, tail):
        h.update(piece)
    return h.hexdigest()


def raw_put(url: str, path: str, token: str, length: int) -> tuple[int, dict[str, object]]:
    """Send only the headers of a PUT declaring ``length`` bytes; the answer (status, body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_uploads_stream_to_disk_and_oversize_ones_are_refused(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "home") as server:
        base = server.url + "/api/v1"
        auth = {"Authorization": f"Bearer {server.admin_token}"}
        with httpx.Client(headers=auth, timeout=120, trust_env=False) as http:
            assert http.get(base + "/status").status_code == 200
            before = peak_rss(server.pid)
            # 64 MiB with its exact digest, chunked: stored, and the server's peak barely moves
            # (it held the body twice over before: the chunks, then their join).
            digest = digest_of(64)
            r = http.put(f"{base}/bundles/{digest}", content=pieces(64))
            assert r.status_code == 201, r.text
            assert r.json()["size"] == 64 * MIB
            grown = peak_rss(server.pid) - before
            assert grown < 24 * MIB, f"the server's peak grew by {grown / MIB:.0f} MiB"
            assert http.head(f"{base}/bundles/{digest}").status_code == 200
            # MAX_BUNDLE_BYTES + 1 declared: 413 at once, before a byte of the body is read.
            status, body = raw_put(
                server.url, f"/api/v1/bundles/{'0' * 64}", server.admin_token, MAX_BUNDLE_BYTES + 1
            )
            assert status == 413 and body["code"] == "body_too_large"
            assert body["details"] == {"limit": MAX_BUNDLE_BYTES}
            # MAX_BUNDLE_BYTES + 1 sent (chunked, so the server counts it as it comes): 413 when
            # the count passes the limit, nothing kept in memory or on disk.
            tail = b"!"
            r = http.put(
                f"{base}/bundles/{digest_of(MAX_BUNDLE_BYTES // MIB, tail)}",
                content=pieces(MAX_BUNDLE_BYTES // MIB, tail),
            )
            assert r.status_code == 413 and r.json()["code"] == "body_too_large"
            grown = peak_rss(server.pid) - before
            assert grown < 24 * MIB, f"the server's peak grew by {grown / MIB:.0f} MiB"
            assert list((server.home / "artifacts").rglob(".upload-*")) == []
            assert http.get(base + "/status").status_code == 200
