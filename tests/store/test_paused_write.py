"""A leader paused inside a write transaction does not hold its standby's takeover back.

Every write of the leader reads the leader row ``FOR SHARE`` first (the fence), and a takeover
bumps that row: it waits for writes in flight, which is the point. But a leader stopped *inside*
one (SIGSTOP, a frozen VM) left its transaction open for as long as it stayed stopped, and no
standby could lead: a fresh-clone run failed the hung-leader test this way, the standby still
"not the leader" 14 s after the hang. PostgreSQL now ends a store transaction idle that long, as
it ends the paused leader's lock session. Real PostgreSQL, the leader's real store and lock
session; the pause is theirs going silent.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from gpulayer_kernel.ha.leadership import Leadership
from gpulayer_kernel.store.postgres import PostgresStore
from gpulayer_kernel.testing.postgres import PostgresServer

IDLE = 1.0  # seconds: the lock session's and a transaction's idle limit here (5 by default)


async def test_a_leader_paused_inside_a_write_does_not_hold_the_takeover(
    gl_postgres: PostgresServer,
) -> None:
    url = gl_postgres.create_database()
    leader = Leadership(url, "http://a.invalid", beat=0.2, session_timeout=IDLE)
    await leader.acquire()
    store = PostgresStore(url, idle_transaction_timeout=IDLE)
    await store.open()
    store.fence = leader.fence
    con = await store.pool.acquire()
    standby = Leadership(url, "http://b.invalid", session_timeout=IDLE)
    try:
        # Inside a write: the fence has run (its share lock is held), nothing more comes.
        open_write = con.transaction()
        await open_write.start()
        await leader.fence(con)
        assert leader._beater is not None
        leader._beater.cancel()  # paused: the lease beats stop with everything else
        epoch = await asyncio.wait_for(standby.acquire(), 10 * IDLE)
        assert leader.epoch is not None and epoch == leader.epoch + 1
    finally:
        # PostgreSQL ended that session: the pool may have taken the connection back already.
        with contextlib.suppress(asyncpg.InterfaceError):
            con.terminate()
            await store.pool.release(con)
        await standby.release()
        await leader.release()
        await store.close()
