"""LISTEN/NOTIFY for trio (agentd.store.postgres._listen) against a real server: delivery at commit only,
lagged on (re)connection and overflow, reconnection after the backend is killed, the end of the watch."""

from __future__ import annotations

import psycopg
import pytest
import trio

from agentd.store.postgres import Listener, Pool, notify
from pgcluster import PgDatabase

CH = "agentd_test"


async def test_a_notification_arrives_when_its_transaction_commits_and_never_after_rollback(pg_db: PgDatabase) -> None:
    listener = Listener(pg_db.dsn, [CH, "other"])
    async with Pool(pg_db.dsn, size=1) as pool, trio.open_nursery() as n:
        await n.start(listener.run)
        with listener.watch(CH) as w:
            def rolled_back(conn: psycopg.Connection) -> None:
                notify(conn, CH, "never")
                raise LookupError

            with pytest.raises(LookupError):
                await pool.run(rolled_back)
            await pool.run(notify, "other", "not for this watch")
            await pool.run(notify, CH, "c1:7")
            with trio.fail_after(5):
                got = await w.next()
            assert got is not None and (got.channel, got.payload) == (CH, "c1:7")
            with trio.move_on_after(0.2):
                assert await w.next() is None or False  # nothing else comes
                pytest.fail("an unexpected notification")
        n.cancel_scope.cancel()


async def test_a_watch_open_before_the_listener_starts_is_told_it_lagged(pg_db: PgDatabase) -> None:
    listener = Listener(pg_db.dsn, [CH])
    with listener.watch() as w:
        async with trio.open_nursery() as n:
            await n.start(listener.run)
            with trio.fail_after(5):
                assert await w.next() is None
            n.cancel_scope.cancel()
        with pytest.raises(trio.EndOfChannel):
            await w.next()


async def test_async_for_over_a_watch_yields_what_next_returns_and_ends_when_the_listener_stops(
        pg_db: PgDatabase) -> None:
    listener = Listener(pg_db.dsn, [CH])
    stop = trio.CancelScope()

    async def listen(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with stop:
            await listener.run(task_status=task_status)

    got: list[str | None] = []
    with listener.watch() as w:
        async with Pool(pg_db.dsn, size=1) as pool, trio.open_nursery() as n:
            await n.start(listen)
            with trio.fail_after(5):
                async for note in w:
                    got.append(None if note is None else note.payload)
                    if note is None:  # the lag of the first LISTEN: now one notification
                        await pool.run(notify, CH, "c1:1")
                    else:
                        stop.cancel()  # the listener stops (this task is not cancelled): the loop ends
                got.append("ended")
    assert got == [None, "c1:1", "ended"]


async def test_overflow_drops_the_buffer_and_reports_lagged(pg_db: PgDatabase) -> None:
    listener = Listener(pg_db.dsn, [CH], buffer=3)
    async with Pool(pg_db.dsn, size=1) as pool, trio.open_nursery() as n:
        await n.start(listener.run)
        with listener.watch() as w, listener.watch(buffer=10) as probe:

            def five(conn: psycopg.Connection) -> None:
                for i in range(5):
                    notify(conn, CH, str(i))

            await pool.run(five)
            with trio.fail_after(5):
                while (got := await probe.next()) is None or got.payload != "4":
                    pass  # every watch has been offered all five now
                assert await w.next() is None  # 5 into a buffer of 3: the watcher must re-read
                await pool.run(notify, CH, "after")
                got = await w.next()
            assert got is not None and got.payload == "after"
        n.cancel_scope.cancel()


async def test_the_listener_reconnects_after_its_backend_dies(pg_db: PgDatabase) -> None:
    listener = Listener(pg_db.dsn, [CH], max_backoff_s=0.2)
    async with Pool(pg_db.dsn, size=1) as pool, trio.open_nursery() as n:
        await n.start(listener.run)
        with listener.watch() as w:
            pg_db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'agentd-listen' AND datname = current_database()")
            with trio.fail_after(10):
                assert await w.next() is None  # lost and restored: re-read the database
                while True:  # until the new LISTEN hears us
                    await pool.run(notify, CH, "again")
                    with trio.move_on_after(0.2):
                        got = await w.next()
                        break
            assert got is not None and got.payload == "again"
        n.cancel_scope.cancel()


def test_notify_refuses_a_payload_postgres_would_refuse() -> None:
    with pytest.raises(ValueError, match="over PostgreSQL"):
        notify(None, CH, "x" * 8000)  # type: ignore[arg-type]
