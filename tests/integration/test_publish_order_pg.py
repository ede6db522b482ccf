"""On the postgres store a failed commit is retried (its rows stay pending, then commit): a record
whose sync raised is durable after all and still reaches live subscribers, and so does a record
whose own sync succeeded (what tests/integration/test_publish_order.py asks of the file store's
failed fsync, which is final, does not hold here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio

from agentd import contract as c
from agentd.config import Config, JournalConfig, StoreConfig, parse_config
from agentd.conversations import ConversationService
from agentd.hub import Hub
from agentd.journal import FsyncPolicy
from agentd.leases import FileLeaseStore
from agentd.runtimes import Runtimes
from agentd.store.file import FileLeases
from agentd.store.postgres import journal as pg_journal

from daemon_harness import REPO
from inprocess import subscribe

ECHO = REPO / "conf" / "scripts" / "echo.toml"


@asynccontextmanager
async def _pg_service(tmp_path: Path, pg_db: Any, fail: list[Any]) -> AsyncIterator[tuple[ConversationService, Hub]]:
    """The service on the postgres store; each item put in ``fail`` fails one commit (awaited first
    when it is a predicate, until it holds): the database unreachable a moment, so the rows are retried."""
    config = Config(store=StoreConfig(backend="postgres", dsn=pg_db.dsn),  # type: ignore[arg-type]
                    journal=JournalConfig(fsync="batch", batch_ms=1))
    state = tmp_path / "state"
    root = state / "conversations"
    root.mkdir(parents=True, mode=0o700)
    store, close, _dsn = await pg_journal.open_postgres(config, root, fsync=FsyncPolicy.BATCH)
    real_run = store.pool.run

    async def run(fn: Any, *args: Any) -> Any:
        if fn is pg_journal._write and fail:
            item = fail.pop(0)
            if callable(item):
                with trio.fail_after(5):
                    while not item():
                        await trio.sleep(0.001)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real_run(fn, *args)

    store.pool.run = run  # type: ignore[method-assign]
    hub = Hub()
    runtimes = Runtimes(parse_config(""), state)
    leases = FileLeases(FileLeaseStore(root, owner="test", ttl_s=30))
    service = ConversationService(store=store, leases=leases, runtimes=runtimes, hub=hub,
                                  fsync=FsyncPolicy.BATCH, owner="test")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await nursery.start(runtimes.run)
            await nursery.start(service.run)
            yield service, hub
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()
        await close()


async def _conversation(service: ConversationService, tmp_path: Path) -> Any:
    work = tmp_path / "work"
    work.mkdir()
    record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
    return await service.live(record.id)


async def test_pg_a_record_whose_commit_failed_then_was_retried_reaches_live_subscribers(
        tmp_path: Path, pg_db: Any) -> None:
    fail: list[Any] = []
    async with _pg_service(tmp_path, pg_db, fail) as (service, hub):
        live = await _conversation(service, tmp_path)
        cid, before = live.record.id, live.published_seq
        outbox = subscribe(hub, cid, before)

        fail.append(1)  # the next commit fails: its rows are retried
        with pytest.raises(c.InternalError):
            await service.note(cid, "task", b'{"n":1}')
        with trio.fail_after(10):  # the retry commits it; the journal takes records again
            while live.journal._broken or live.journal.durable_seq <= before:
                await trio.sleep(0.02)
        seq2 = await service.note(cid, "task", b'{"n":2}')

        on_disk = [msgspec.json.decode(x)["seq"] for x in await live.journal.read_after(before)]
        got = [r.seq for r in outbox.records]
        assert on_disk == [before + 1, seq2], on_disk
        # Both records are committed; a live subscriber must get both, as a catch-up would.
        assert got == on_disk, (got, on_disk)


async def test_pg_a_record_whose_own_sync_succeeded_is_published(tmp_path: Path, pg_db: Any) -> None:
    # A journals N; its commit is in flight when B journals N+1 (B waits for the next commit).
    # A's commit fails, the retry commits both, B's sync returns: B's record is published (an
    # _append that dropped N and N+1 from live.syncing on A's failure published nothing).
    fail: list[Any] = []
    async with _pg_service(tmp_path, pg_db, fail) as (service, hub):
        live = await _conversation(service, tmp_path)
        cid, before = live.record.id, live.published_seq
        outbox = subscribe(hub, cid, before)

        fail.append(lambda: live.journal.last_seq >= before + 2)  # A's commit fails once B's row is appended
        results: dict[str, Any] = {}

        async def a() -> None:
            try:
                await service.note(cid, "task", b'{"who":"A"}')
            except c.InternalError as exc:
                results["A"] = exc

        async def b() -> None:
            with trio.fail_after(5):
                while fail:  # A's commit is in flight (its write waits for B's row)
                    await trio.sleep(0)
            results["B"] = await service.note(cid, "task", b'{"who":"B"}')

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a)
                nursery.start_soon(b)
        assert isinstance(results.get("A"), c.InternalError), results
        seq_b = results["B"]
        assert seq_b == before + 2, results  # B's record journaled, committed, acknowledged
        got = [r.seq for r in outbox.records]
        assert seq_b in got, (got, seq_b)  # ... and so published


async def test_pg_an_ending_record_whose_commit_failed_is_journaled_once(tmp_path: Path, pg_db: Any) -> None:
    # A turn's end whose commit failed is told live (seq 0), and its row is retried and committed.
    # It was also queued as unjournaled, and written again once the journal recovered: twice.
    fail: list[Any] = []
    async with _pg_service(tmp_path, pg_db, fail) as (service, hub):
        live = await _conversation(service, tmp_path)
        before = live.published_seq
        fail.append(1)  # the next commit fails: its rows are retried
        turn = c.Turn(state=c.TurnState.COMPLETED)
        await service._append_or_publish(live, "turn", msgspec.json.encode(turn), run="")
        assert not fail and not live.unjournaled
        with trio.fail_after(10):  # the retry commits it; the journal takes records again
            while live.journal._broken or live.journal.durable_seq <= before:
                await trio.sleep(0.02)
        await service.note(live.record.id, "task", b'{"n":2}')  # what recovery wrote, if anything, is before it
        on_disk = [msgspec.json.decode(x)["type"] for x in await live.journal.read_after(before)]
        assert on_disk == ["turn", "task"], on_disk
