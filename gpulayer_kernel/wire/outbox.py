"""The send side of a GPU kernel's relay, at both ends (the Jupyter host's and the worker's).

Messages a ZMQ socket gave are ``put`` here and sent in batches by ``run``: everything that came
while the last batch went goes in the next (a Nagle without the delay). The outbox holds at most
``max_bytes``: a reader of the sockets awaits ``room()`` first, so a relay that cannot send leaves
the messages in ZMQ's queues instead of this process's memory. What a send may meet:

- ``Busy`` (the control plane's lane is full): the same batch again after a short wait;
- ``TooLarge`` (one message can never go): that message is dropped and ``refused`` is told (the
  host answers its cell); the rest of the batch goes on, so nothing blocks behind it;
- ``NotFound`` (a restarted control plane that forgot the kernel): ``lost`` may mend it (the host
  re-attaches with its key) and the batch goes again; otherwise it is dropped, said once;
- ``Conflict`` (the kernel has ended: ``kernel_ended``): the batch is dropped; its cells are
  answered when the end is read;
- anything else (unreachable, restarting): kept and sent again with backoff, so no reply is lost
  to a restart of the control plane.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..errors import Busy, Conflict, NotFound, TooLarge
from .kernels import KernelMessage

log = logging.getLogger("gpulayer.wire")

OUTBOX_BYTES = 32 << 20  # bytes held here before the sockets' readers wait


class Outbox:
    """Batched, bounded sending of one kernel's messages (see the module docstring)."""

    def __init__(
        self,
        send: Callable[[list[KernelMessage]], Awaitable[None]],
        what: str,
        *,
        refused: Callable[[KernelMessage, TooLarge], None] | None = None,
        lost: Callable[[NotFound], Awaitable[bool]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_bytes: int = OUTBOX_BYTES,
    ) -> None:
        self._send = send
        self.what = what
        self.refused = refused
        self.lost = lost
        self.sleep = sleep
        self.max_bytes = max_bytes
        self._items: list[KernelMessage] = []
        self._bytes = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()

    def put(self, m: KernelMessage) -> None:
        self._items.append(m)
        self._bytes += m.size
        self._ready.set()

    async def room(self) -> None:
        """Return once the outbox holds less than its bound."""
        while self._bytes > self.max_bytes:
            self._room.clear()
            await self._room.wait()

    async def run(self) -> None:
        """Send forever (cancel to stop), one batch at a time."""
        tries = 0
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self._items = self._items, []
            while batch:
                try:
                    await self._send(batch)
                    tries = 0
                    break
                except asyncio.CancelledError:
                    raise
                except TooLarge as exc:
                    batch = self._drop_too_large(batch, exc)
                except Busy:
                    await self.sleep(min(1.0, 0.05 * 2**tries))  # the lane drains: again
                    tries += 1
                except Conflict as exc:
                    log.info("%s: %s; %d message(s) dropped", self.what, exc.message, len(batch))
                    break
                except NotFound as exc:
                    if self.lost is not None and await self.lost(exc):
                        continue
                    log.warning("%s: %s; %d message(s) dropped", self.what, exc, len(batch))
                    break
                except Exception as exc:
                    # Kept and sent again: a restart of the control plane loses no reply.
                    log.info("%s: sending failed (%s); retrying", self.what, exc)
                    await self.sleep(min(5.0, 0.1 * 2**tries))  # retry backoff
                    tries += 1
            self._bytes = sum(m.size for m in self._items)
            self._room.set()

    def _drop_too_large(self, batch: list[KernelMessage], exc: TooLarge) -> list[KernelMessage]:
        """The batch less the message the relay refused (its size is in the refusal)."""
        size = int(exc.details.get("size", -1))
        at = next((i for i, m in enumerate(batch) if m.size == size), 0)
        log.warning("%s: %s", self.what, exc.message)
        if self.refused is not None:
            self.refused(batch[at], exc)
        return batch[:at] + batch[at + 1 :]
