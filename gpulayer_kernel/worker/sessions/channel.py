"""A session rank's socket to its worker (ADR 0019): frames out through one sender thread, and
the running cell's output batched into them (``host.py`` runs the cell).

While a cell runs only the sender thread writes the socket, so a KeyboardInterrupt in the main
thread can never cut a frame in two; a cell's done frame, made once SIGINT is ignored again, goes
from the main thread itself (``send_now``: one thread hop less per cell). A cell's text output
is capped as the worker asks in its run request (``cap``: characters and lines,
``CELL_OUTPUT_CAP`` and ``CELL_OUTPUT_LINES`` in ``contracts/limits.py``): past it, writes are
counted, not kept, so a cell printing in a loop neither floods the socket nor grows this process;
its done frame says how much was dropped (``dropped``: lines, characters) and the worker writes
the one line that says so. Stdlib only (a rank imports it before anything else).
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Any

from .wire import send_frame

FLUSH_EVERY = 0.05  # seconds between two output frames of a running cell


class Channel:
    """The worker's socket: frames out through one sender thread, cell output batched."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._out: collections.deque[dict[str, Any]] = collections.deque()
        self._wake = threading.Event()
        self.items: collections.deque[list[Any]] = collections.deque()  # the running cell's
        self.cell: int | None = None
        self.lock = threading.Lock()  # taken outside cells only: no interrupt can land in it
        self._last = 0.0
        self.cap: tuple[int, int] | None = None  # the running cell's: characters, lines
        self._kept = [0, 0]  # characters and lines of text the running cell kept
        self.dropped = [0, 0]  # lines and characters it printed past its cap
        self._open = False  # the dropped text so far ends inside a line
        self._sending = threading.Lock()  # one frame on the socket at a time, whole
        self._thread = threading.Thread(target=self._send_loop, name="gpulayer-session-send")
        self._thread.daemon = True
        self._thread.start()

    def send(self, message: dict[str, Any]) -> None:
        self._out.append(message)  # deque.append is atomic: safe from any thread, any moment
        self._wake.set()

    def send_now(self, message: dict[str, Any]) -> None:
        """Send from this thread, after the frames queued before it: a cell's done frame skips
        the hop to the sender thread (~0.1 ms a cell on a loaded 2-core box). Only where no
        interrupt can land: a frame cut in half would break the stream."""
        with self._sending:
            while self._out:
                send_frame(self.sock, self._out.popleft())
            send_frame(self.sock, message)
            self._last = time.monotonic()

    def start_cell(self, n: int, cap: tuple[int, int] | None) -> None:
        self.items.clear()
        self.cap, self._kept, self.dropped = cap, [0, 0], [0, 0]
        self._open = False  # the dropped text so far ends inside a line
        self.cell = n

    def output(self, kind: str, text: str) -> None:
        """Text the running cell printed: kept up to its cap, counted past it."""
        cap = self.cap
        if cap is not None:
            room = cap[0] - self._kept[0]
            if self.dropped[1] or room <= 0 or self._kept[1] >= cap[1]:
                self._drop(text)
                return
            if len(text) > room:  # the rest of a long write is dropped (a line: its end)
                self._drop(text[room:])
                text = text[:room]
            self._kept[0] += len(text)
            self._kept[1] += text.count("\n")
        self.items.append([kind, text])  # deque.append is atomic

    def _drop(self, text: str) -> None:
        """Count ``text`` as dropped: its characters, and its *lines*, not the writes it came
        in (a long line printed in many writes is one line; issue 32 counted each write)."""
        if not text:
            return
        was_open, self._open = self._open, not text.endswith("\n")
        # Lines touched: each newline ends one; a line still open at the end counts once.
        self.dropped[0] += text.count("\n") + self._open - was_open
        self.dropped[1] += len(text)

    def take_items(self) -> list[list[Any]]:
        """The running cell's output so far, merged (consecutive text of one stream joined)."""
        out: list[list[Any]] = []
        texts: list[str] = []  # the run of one stream's text being merged
        stream = ""
        while True:
            try:
                kind, payload = self.items.popleft()
            except IndexError:
                break
            if kind == stream:
                texts.append(payload)
                continue
            if texts:
                # Joined once: ``+=`` on a string held in a list copies it every time, and a
                # cell printing 100k lines between two frames made that quadratic (minutes, while
                # the lock was held and the cell could not end, interrupted or not).
                out.append([stream, "".join(texts)])
            texts, stream = [], ""
            if kind == "display":
                out.append([kind, payload])
            else:
                texts, stream = [payload], kind
        if texts:
            out.append([stream, "".join(texts)])
        return out

    def _send_loop(self) -> None:
        while True:
            self._wake.wait(FLUSH_EVERY)
            self._wake.clear()
            while self._out:
                with self._sending:
                    if self._out:  # (``send_now`` may have sent it meanwhile)
                        send_frame(self.sock, self._out.popleft())
                        self._last = time.monotonic()
            if self.cell is None or not self.items or time.monotonic() - self._last < FLUSH_EVERY:
                continue
            # Under the lock the cell cannot end (``end_cell``): this frame goes out before
            # its done frame is even made.
            with self.lock:
                if self.cell is not None:
                    items = self.take_items()
                    if items:
                        with self._sending:
                            send_frame(self.sock, {"out": self.cell, "items": items})
                            self._last = time.monotonic()

    def end_cell(self) -> list[list[Any]]:
        """The cell is over: what it printed since the last frame (for its done frame)."""
        with self.lock:
            self.cell = None
            return self.take_items()

    def close(self) -> None:
        self._wake.set()


class OutStream:
    """``sys.stdout``/``sys.stderr`` inside a cell: text goes out as the cell's stream output."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, name: str, channel: Channel, fd: int) -> None:
        self.name = name
        self._channel = channel
        self._fd = fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._channel.output(self.name, text)
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd  # the job's pipe: what is written there reaches the cell's log too

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False
