"""Redaction without gaps: no secret leaks across a line split, a chunk, a result or progress."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpulayer_kernel.contracts import LogLine
from gpulayer_kernel.redact import MASK, Redactor
from gpulayer_kernel.worker.logship import MAX_LINE, LogShipper, pump_stream

SECRET = "CANARY-7f3a9b2c4d5e6f708192a3b4c5d6e7f8"


def _leaks(text: str, secret: str = SECRET, shortest: int = 4) -> list[str]:
    """Every piece of ``secret`` at least ``shortest`` characters long that ``text`` contains."""
    return [
        secret[i:j]
        for i in range(len(secret))
        for j in range(i + shortest, len(secret) + 1)
        if secret[i:j] in text
    ]


async def _pieces(data: list[bytes], redactor: Redactor) -> list[str]:
    """What the worker ships for a pipe that delivers ``data`` in these chunks."""
    shipped: list[str] = []

    async def send(lines: list[LogLine]) -> None:
        shipped.extend(line.text for line in lines)

    shipper = LogShipper(send, redactor)
    reader = asyncio.StreamReader()

    async def feed() -> None:
        for chunk in data:  # one read per chunk, as a pipe written in pieces delivers them
            reader.feed_data(chunk)
            while len(reader._buffer):
                await asyncio.sleep(0)
        reader.feed_eof()

    await asyncio.gather(feed(), pump_stream(reader, "stdout", shipper))
    await shipper.close()
    return shipped


# Offsets of the secret's first character around the 64 KiB split (the case: 65530).
OFFSETS = [MAX_LINE - len(SECRET) - 1, MAX_LINE - len(SECRET), MAX_LINE - 26, 65530, MAX_LINE - 1]
OFFSETS += [MAX_LINE, MAX_LINE + 1, 2 * MAX_LINE - 10]


@pytest.mark.parametrize("offset", OFFSETS)
async def test_a_secret_straddling_the_line_split_never_leaks(offset: int) -> None:
    # As `print(text, end="", flush=True)` then `print()`: the newline comes in a later read.
    text = ("x" * offset + SECRET).encode()
    chunks = [text[i : i + 1000] for i in range(0, len(text), 1000)] + [b"\n"]
    pieces = await _pieces(chunks, Redactor({"CANARY": SECRET}))
    for piece in pieces:
        assert len(piece) <= 2 * MAX_LINE + len(SECRET) and not _leaks(piece), piece[-60:]
    assert "".join(pieces) == "x" * offset + MASK  # nothing lost, nothing but the secret hidden


@pytest.mark.parametrize("step", [pytest.param(1, marks=pytest.mark.slow), 7, 4096, 65536])
async def test_chunk_boundaries_do_not_matter(step: int) -> None:
    line = ("x" * 65530 + SECRET + " and again " + SECRET + "\nnext " + SECRET).encode()
    line = line.replace(b"\n", b"\n" + b"y" * 70000 + SECRET.encode() + b"\n")
    pieces = await _pieces(
        [line[i : i + step] for i in range(0, len(line), step)], Redactor({"C": SECRET})
    )
    assert not any(_leaks(p) for p in pieces)
    expected = "x" * 65530 + f"{MASK} and again {MASK}" + "y" * 70000 + MASK + f"next {MASK}"
    assert "".join(pieces) == expected


async def test_a_character_split_between_two_reads_stays_whole() -> None:
    data = "é€".encode()
    assert await _pieces([data[:1], data[1:3], data[3:]], Redactor()) == ["é€"]


def test_cut_never_falls_inside_a_secret() -> None:
    r = Redactor({"A": "abcdefgh"})
    text = "x" * 10 + "abcdefgh" + "y" * 20
    assert r.window == 7
    assert r.cut(text, 12) == 10  # before the secret that crosses 12
    assert r.cut("abcdefgh" + "y" * 20, 3) == 8  # a secret at the start: after it
    assert r.cut(text, 5) == 5 and r.cut(text, 18) == 18
    assert Redactor().cut(text, 12) == 12


def test_json_values_are_redacted_recursively_strings_only() -> None:
    r = Redactor({"A": SECRET})
    value: Any = {"token": SECRET, "n": 3, "nested": [f"Bearer {SECRET}", 1.5, None, True]}
    value[SECRET] = "key"
    assert r.redact_json(value) == {
        "token": MASK,
        "n": 3,
        "nested": [f"Bearer {MASK}", 1.5, None, True],
        MASK: "key",
    }
    assert r.redact_json(SECRET) == MASK and r.redact_json(7) == 7
    assert Redactor().redact_json(value) is value
