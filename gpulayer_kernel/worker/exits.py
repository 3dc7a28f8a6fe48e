"""How a process ended, in numbers and in words: the one rule for every job and every rank."""

from __future__ import annotations

import signal


def exit_status(code: int | None) -> int | None:
    """A ``returncode`` (``-N`` when killed by signal N) as a shell reports it (``128 + N``)."""
    if code is None:
        return None
    return 128 - code if code < 0 else code


def describe_exit(code: int | None, subject: str | None = None) -> str:
    """How a process ended, in words, from its ``returncode``: ``"killed by SIGKILL"``.

    ``"exited with code 3"`` for an exit; with a ``subject``, a sentence about it:
    ``"rank 1 was killed by SIGKILL"``, ``"rank 1 exited with code 3"``.
    """
    if code is None:
        what = "the process did not report an exit status"
        return f"{subject}: {what}" if subject else what
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{subject} was killed by {name}" if subject else f"killed by {name}"
    what = f"exited with code {code}"
    return f"{subject} {what}" if subject else what
