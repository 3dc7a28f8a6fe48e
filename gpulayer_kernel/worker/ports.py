"""Ports and addresses for a gang's rendezvous (ADR 0007): which ports, held by whom, on which NIC.

Rank 0's node binds a port for torchrun's store before torchrun starts and holds it until the job
ends (:class:`PortReservations`, one per worker, owned by its agent), so no other job of the same
worker, and no other program on the machine, takes it in between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterable

from ..errors import GPUlayerError

PORTS_ENV = "GPULAYER_RENDEZVOUS_PORTS"
"""Worker setting: ports (``29500-29509,29600``) the rendezvous may use; default: any free one."""

_SIOCGIFADDR = 0x8915


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (racy: prefer :meth:`PortReservations.reserve`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parse_ports(spec: str) -> list[int]:
    """``"29500-29502,29600"`` → ``[29500, 29501, 29502, 29600]``; a bad spec is an error."""
    ports: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise GPUlayerError(
                f"{PORTS_ENV}={spec!r}: {part!r} is not a port or a range",
                hint="write ports and ranges like 29500-29509,29600",
            ) from None
        if not 1 <= first <= last <= 65535:
            raise GPUlayerError(f"{PORTS_ENV}={spec!r}: {part!r} is not within 1-65535")
        ports.extend(range(first, last + 1))
    return ports


class PortReservations:
    """The rendezvous ports one worker holds right now: never the same port for two of its jobs."""

    def __init__(self) -> None:
        self._held: set[int] = set()

    def __contains__(self, port: object) -> bool:
        return port in self._held

    def reserve(self, host: str, candidates: Iterable[int] | None = None) -> socket.socket:
        """Bind (not listen) a port for torchrun's store; hold it until :meth:`release`.

        The socket has ``SO_REUSEADDR`` and never listens, so torchrun's own store (which also
        sets ``SO_REUSEADDR``) can bind and listen on the same port, while the kernel hands that
        port to no other ``bind(0)`` or outgoing connection in the meantime: no window between
        picking a port and using it. A candidate someone else already listens on fails to bind
        and the next one is tried. ``candidates`` default to ``$GPULAYER_RENDEZVOUS_PORTS``, else
        any free port.
        """
        if candidates is None:
            configured = os.environ.get(PORTS_ENV, "")
            candidates = parse_ports(configured) if configured.strip() else [0]
        tried: list[int] = []
        for port in candidates:
            if port and port in self._held:
                continue  # another job of this worker holds it
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                s.close()
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise  # not an address of this machine (EADDRNOTAVAIL): the caller decides
                tried.append(port)  # taken (or privileged): try the next candidate
                continue
            self._held.add(int(s.getsockname()[1]))
            return s
        raise GPUlayerError(
            f"no free port for the rendezvous on {host}: tried {_ports_text(tried)}",
            hint=f"free one of them, or widen {PORTS_ENV} on this worker",
        )

    def release(self, reservation: socket.socket) -> None:
        """Give a reserved port back (its job's torchrun has exited) and close its socket."""
        with contextlib.suppress(OSError):
            self._held.discard(int(reservation.getsockname()[1]))
        reservation.close()


def _ports_text(ports: list[int]) -> str:
    shown = ", ".join("any" if p == 0 else str(p) for p in ports[:8])
    return shown + (f" and {len(ports) - 8} more" if len(ports) > 8 else "") if ports else "none"


def interface_for(addr: str) -> str | None:
    """The name of the local network interface that holds IPv4 ``addr``, or None."""
    if addr.startswith("127."):
        return "lo"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    return None
