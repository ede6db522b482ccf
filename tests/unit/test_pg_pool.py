"""The PostgreSQL connection pool (agentd.store.postgres._pool) against a real server: transactions,
the pool's bound, a trio loop that keeps running meanwhile, broken connections, cancellation."""

from __future__ import annotations

import time

import psycopg
import pytest
import trio

from agentd.store.postgres import Pool, StoreUnavailable
from pgcluster import PgDatabase


async def test_run_commits_on_return_and_rolls_back_on_error(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=2) as pool:
        await pool.execute("CREATE TABLE t (x int)")

        def insert(conn: psycopg.Connection, x: int, fail: bool) -> None:
            conn.execute("INSERT INTO t VALUES (%s)", (x,))
            if fail:
                raise KeyError("after the insert")

        await pool.run(insert, 1, False)
        with pytest.raises(KeyError):
            await pool.run(insert, 2, True)
        assert await pool.execute("SELECT x FROM t") == [(1,)]


async def test_at_most_size_connections_and_the_loop_keeps_running(pg_db: PgDatabase) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.02)
            ticks += 1

    async with Pool(pg_db.dsn, size=2, application_name="pooltest") as pool:
        peak = 0

        async def sleeper() -> None:
            nonlocal peak
            rows = await pool.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooltest' "
                                      "AND state = 'active' AND pg_sleep(0.2) IS NOT NULL")
            peak = max(peak, rows[0][0])

        t0 = time.monotonic()
        async with trio.open_nursery() as n:
            n.start_soon(ticker)
            async with trio.open_nursery() as calls:
                for _ in range(6):
                    calls.start_soon(sleeper)
            n.cancel_scope.cancel()
        took = time.monotonic() - t0
        assert took >= 0.6  # 6 calls of 0.2 s, 2 at a time
        assert ticks >= 10  # ~30 at 20 ms; the loop was never blocked for long
        conns = await pool.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooltest'")
        assert conns[0][0] <= 2 and peak <= 2


async def test_a_broken_connection_fails_one_call_then_the_pool_reconnects(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1, application_name="breaktest") as pool:
        pid = (await pool.execute("SELECT pg_backend_pid()"))[0][0]
        pg_db.execute(f"SELECT pg_terminate_backend({pid})")
        with pytest.raises(StoreUnavailable) as err:
            await pool.execute("SELECT 1")
        assert not err.value.permanent
        assert (await pool.execute("SELECT pg_backend_pid()"))[0][0] != pid


async def test_cancelled_caller_waits_for_its_statement_and_the_connection_is_reused(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        pid = (await pool.execute("SELECT pg_backend_pid()"))[0][0]
        with trio.move_on_after(0.05):
            await pool.execute("SELECT pg_sleep(0.3)")
        # the same connection, idle (not in a transaction), serves the next call
        rows = await pool.run(lambda c: (c.execute("SELECT pg_backend_pid()").fetchone()[0],
                                         c.info.transaction_status.name), transaction=False)
        assert rows == (pid, "IDLE")


async def test_statement_timeout_bounds_a_statement(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1, statement_timeout_s=0.2) as pool:
        with pytest.raises(psycopg.errors.QueryCanceled):
            await pool.execute("SELECT pg_sleep(5)")
        assert await pool.execute("SELECT 1") == [(1,)]


async def test_sessions_run_in_utc(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        assert await pool.execute("SHOW TimeZone") == [("UTC",)]


async def test_a_closed_pool_refuses_calls(pg_db: PgDatabase) -> None:
    pool = Pool(pg_db.dsn, size=1)
    await pool.open()
    await pool.aclose()
    with pytest.raises(StoreUnavailable, match="closed"):
        await pool.execute("SELECT 1")
