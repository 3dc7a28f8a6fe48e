"""Notebook small wrongs (issue 32, items 8 and 9).

- The dropped-output note counts *lines*, not the fragments a long line came in: a cell printing
  one long line in many writes said "2 lines (278.1 MiB)" (the session host's count, per write),
  and a job's long line shipped in 64 KiB pieces counted each piece.
- The note names itself ("[gpulayer] …") and the notebook prefixes system lines with
  "gpulayer: ": it showed "gpulayer: [gpulayer] …".
- A cell cut off by a control plane restart said "did not run; run it again", then hinted
  "%gpulayer session restart … (their state is lost)" for a healthy session: the restart hint
  is for a broken session only.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import pytest

from gpulayer_kernel import render
from gpulayer_kernel.contracts import LogLine, LogRecord, SessionStatus
from gpulayer_kernel.contracts.limits import LINE_PIECE
from gpulayer_kernel.errors import Unavailable
from gpulayer_kernel.jupyter.sessions.cells import aborted_hint, show_records
from gpulayer_kernel.redact import Redactor
from gpulayer_kernel.worker.logship import LogShipper, pump_stream
from gpulayer_kernel.worker.sessions.channel import Channel


def test_the_session_host_counts_dropped_lines_not_writes() -> None:
    a, b = socket.socketpair()
    try:
        ch = Channel(a)
        ch.start_cell(1, (10, 100))  # 10 characters kept at most
        ch.output("stdout", "x" * 5)
        ch.output("stdout", "y" * 20)  # the line goes on past the cap: its rest dropped
        ch.output("stdout", "z" * 30)  # the same line, another write
        ch.output("stdout", "\n")  # ... ends here
        ch.output("stdout", "a\nb\n")  # two more lines
        ch.output("stdout", "tail")  # and one left open when the cell ends
        assert ch.dropped == [4, 15 + 30 + 1 + 4 + 4]
    finally:
        ch.end_cell()  # its sender thread sends nothing more: the sockets can go
        a.close()
        b.close()


def _shipper(cap: int) -> tuple[LogShipper, list[LogLine]]:
    handed: list[LogLine] = []

    def queue(lines: list[LogLine]) -> asyncio.Future[None]:
        handed.extend(lines)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def never(_: list[LogLine]) -> None:
        raise AssertionError("queue mode sends nothing itself")

    return LogShipper(never, Redactor({}), queue=queue, cap=cap), handed


async def test_a_job_s_long_line_past_its_cap_counts_once() -> None:
    shipper, _ = _shipper(cap=1000)
    shipper.add("stdout", "k" * 900)  # kept
    shipper.add("stdout", "L" * (3 * LINE_PIECE))  # one line, three pieces: dropped
    shipper.add("stdout", "short")  # one more line dropped
    note = shipper.note()
    await shipper.close()
    assert note is not None and note.text.startswith("[gpulayer] 2 lines ("), note.text


async def test_a_line_read_from_a_pipe_in_pieces_counts_once() -> None:
    shipper, _ = _shipper(cap=100)
    reader = asyncio.StreamReader()
    reader.feed_data(b"fits\n" + b"P" * (4 * LINE_PIECE) + b"\nlast\n")
    reader.feed_eof()
    await pump_stream(reader, "stdout", shipper)
    note = shipper.note()
    await shipper.close()
    assert note is not None and note.text.startswith("[gpulayer] 2 lines ("), note.text


def test_the_note_says_gpulayer_once(capsys: pytest.CaptureFixture[str]) -> None:
    note = "[gpulayer] 2 lines (278.1 MiB) of output dropped: a cell's output is capped at 8 MiB"
    rec = LogRecord(seq=1, time=0.0, stream="system", text=note)
    assert render.log_text(rec) == "gpulayer: " + note.removeprefix("[gpulayer] ")
    show_records([rec])
    assert capsys.readouterr().out == "gpulayer: 2 lines (278.1 MiB) of output dropped: " + (
        "a cell's output is capped at 8 MiB\n"
    )


@dataclass
class _Session:
    """The two things ``aborted_hint`` reads of a ``SessionHandle``: its name and status (a
    status that cannot be read raises, as a handle's does when the server is away)."""

    name: str
    state: SessionStatus | None

    @property
    def status(self) -> SessionStatus:
        if self.state is None:
            raise Unavailable("the control plane does not answer")
        return self.state


@pytest.mark.parametrize(
    ("state", "says", "never"),
    [
        (SessionStatus.IDLE, "run the cell again: session s is idle and kept its state", "restart"),
        (SessionStatus.BUSY, "run the cell again", "restart"),
        (SessionStatus.BROKEN, "%gpulayer session restart s", "run the cell again"),
        (SessionStatus.ENDED, "%gpulayer session start --name s", "restart"),
        (None, "%gpulayer session show s", "restart"),
    ],
)
def test_the_restart_hint_is_for_a_broken_session_only(
    state: SessionStatus | None, says: str, never: str
) -> None:
    hint = aborted_hint(_Session("s", state))  # type: ignore[arg-type]
    assert says in hint and never not in hint.replace(says, ""), hint
