"""One suite for every conversation store (agentd.store): the file store and PostgreSQL.

Each test runs against both, opened through ``open_store`` as the daemon opens them; the
PostgreSQL one against a real server (tests/pgcluster.py, a database of its own per test).
What they must agree on: seq 1..n with no gap, reads after a seq with limits, durability once
synced (a second store on the same place reads it), records, removal, ids, bad input refused
with nothing lost, a damaged journal reported with the seq where it breaks.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
import trio

from agentd import wire
from agentd.config import Config, JournalConfig, Paths, StoreConfig
from agentd.contract import Invalid
from agentd.journal import JournalCorrupt
from agentd.store import Store, open_store, read_published

BACKENDS = ["file", "postgres"]

Opener = Callable[[], Awaitable[Store]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def dsn(backend: str, request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("pg_db").dsn if backend == "postgres" else ""


@pytest.fixture
async def opener(backend: str, dsn: str, tmp_path: pathlib.Path) -> AsyncIterator[Opener]:
    """Opens stores on the same place (state dir, database); every one is closed at the end."""
    config = Config(store=StoreConfig(backend=backend, dsn=dsn),  # type: ignore[arg-type]
                    journal=JournalConfig(fsync="batch", batch_ms=1))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    paths = Paths(state_dir=state, runtime_dir=tmp_path, socket=tmp_path / "s", token_file=tmp_path / "t")
    opened: list[Store] = []

    async def open_one() -> Store:
        store = await open_store(config, paths, owner=f"test{len(opened)}")
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.aclose()


@pytest.fixture
async def store(opener: Opener) -> Store:
    return await opener()


def _payload(n: int) -> bytes:
    return msgspec.json.encode({"n": n, "text": f"record {n} ✓"})


def _seqs(lines: list[bytes]) -> list[int]:
    return [json.loads(line)["seq"] for line in lines]


async def test_the_store_says_what_it_is(store: Store, backend: str) -> None:
    caps = store.capabilities
    assert caps.backend == backend and caps.events and caps.leases
    assert caps.shared is (backend == "postgres") and caps.crash_safe_append is (backend == "file")


async def test_append_gives_seq_one_to_n_and_the_line_is_the_record(store: Store) -> None:
    j = await store.conversations.open("c1")
    assert j.last_seq == 0 and await j.read_after(0) == []
    got = [j.append("item", _payload(n), run="r1" if n % 2 else "") for n in range(1, 6)]
    assert [seq for seq, _ in got] == [1, 2, 3, 4, 5] and j.last_seq == 5
    for n, (seq, line) in enumerate(got, 1):
        rec = wire.decode_record(line)
        assert (rec.seq, rec.type, rec.run) == (n, "item", "r1" if n % 2 else "")
        assert msgspec.json.decode(rec.data) == {"n": n, "text": f"record {n} ✓"}
        assert rec.ts.endswith("Z") and len(rec.ts) == len("2026-01-01T00:00:00.000Z")
    await j.sync()
    assert await j.read_after(0) == [line for _, line in got]


async def test_read_after_honours_after_and_limit(store: Store) -> None:
    j = await store.conversations.open("c1")
    for n in range(1, 101):
        j.append("item", _payload(n))
    await j.sync()
    assert _seqs(await j.read_after(0)) == list(range(1, 101))
    assert _seqs(await j.read_after(40, limit=5)) == [41, 42, 43, 44, 45]
    assert _seqs(await j.read_after(98, limit=10)) == [99, 100]
    assert _seqs(await j.read_after(-3, limit=2)) == [1, 2]
    assert await j.read_after(100) == [] and await j.read_after(250) == []
    assert await j.read_after(10, limit=0) == []
    assert _seqs(await read_published(j, 70, chunk=16)) == list(range(1, 71))


async def test_read_after_stops_before_max_bytes_and_gives_the_first_record_whatever_its_size(store: Store) -> None:
    j = await store.conversations.open("c1")
    for n in range(1, 1501):  # past the PostgreSQL store's memory tail: both of its read paths
        data = msgspec.json.encode({"n": n, "text": "x" * ((n * 37) % 700)})
        j.append("item" if n % 3 else "usage", data, run=f"r{n % 5}" if n % 2 else "")
    await j.sync()
    every = await j.read_after(0)

    def prefix(after: int, budget: int, limit: int | None = None) -> list[bytes]:
        out: list[bytes] = []
        for line in every[after:after + (limit or len(every))]:
            if out and sum(map(len, out)) + len(line) > budget:
                break
            out.append(line)
        return out

    for after, budget, limit in [(0, 1, None), (0, 5_000, None), (10, 100_000, None), (400, 60_000, None),
                                 (470, 40_000, None), (1_400, 10**9, None), (1_490, 50, None), (0, 10**9, 3),
                                 (300, 2_000, 100)]:
        got = await j.read_after(after, limit=limit, max_bytes=budget)
        assert got == prefix(after, budget, limit), (after, budget, limit)
    assert len(await j.read_after(0, max_bytes=1)) == 1 and await j.read_after(1_500, max_bytes=1) == []


async def test_scan_gives_every_line_once_in_chunks_of_bounded_bytes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentd import store as store_mod

    monkeypatch.setattr(store_mod, "SCAN_BYTES", 3_000)
    j = await store.conversations.open("c1")
    for n in range(1, 1201):
        j.append("item", msgspec.json.encode({"n": n, "text": "y" * (n % 50) * (40 if n % 97 == 0 else 1)}))
    await j.sync()
    every = await j.read_after(0)
    chunks = [c async for c in store_mod.scan(j)]
    assert [line for c in chunks for line in c] == every
    assert all(len(c) == 1 or sum(map(len, c)) <= 3_000 for c in chunks) and len(chunks) > 10
    assert [line for c in [c async for c in store_mod.scan(j, 700, after=650)] for line in c] == every[650:700]


async def test_synced_records_survive_a_reopen_and_the_seq_runs_on(opener: Opener) -> None:
    first = await opener()
    j = await first.conversations.open("c1")
    lines = [j.append("item", _payload(n))[1] for n in range(1, 1501)]  # past the PostgreSQL store's memory tail
    await j.sync()
    assert await j.read_after(0) == lines  # the oldest from the database, the newest from memory
    size = j.size
    await first.aclose()

    again = await opener()
    j2 = await again.conversations.open("c1")
    assert j2.last_seq == 1500 and await again.conversations.journal_size("c1") == size
    assert await j2.read_after(0) == lines
    assert await j2.read_after(1200, limit=3) == lines[1200:1203]
    seq, _ = j2.append("turn", b'{"state":"completed"}', run="r9")
    assert seq == 1501


async def test_a_second_store_reads_what_the_first_synced(opener: Opener) -> None:
    writer, reader = await opener(), await opener()
    j = await writer.conversations.open("c1")
    lines = [j.append("item", _payload(n))[1] for n in range(1, 4)]
    await j.sync()
    assert await (await reader.conversations.open("c1")).read_after(0) == lines


async def test_group_commit_makes_appends_durable_without_a_sync(opener: Opener) -> None:
    writer, reader = await opener(), await opener()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.conversations.run)
        j = await writer.conversations.open("c1")
        j.append("item", _payload(1))
        writer.conversations.write_record("c1", b'{"id":"c1"}')
        with trio.fail_after(10):
            while await reader.conversations.journal_size("c1") == 0:
                await trio.sleep(0.005)
        assert await reader.conversations.read_record("c1") == b'{"id":"c1"}'
        nursery.cancel_scope.cancel()


async def test_appends_made_while_a_commit_is_in_flight_are_committed_by_the_next(opener: Opener) -> None:
    store = await opener()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.conversations.run)
        journals = [await store.conversations.open(f"c{i}") for i in range(4)]

        async def writer(j: Any) -> None:
            for n in range(1, 61):
                j.append("item", _payload(n))
                if n % 3 == 0:
                    await j.sync()
                else:
                    await trio.sleep(0)
            await j.sync()

        async with trio.open_nursery() as writers:
            for j in journals:
                writers.start_soon(writer, j)
        nursery.cancel_scope.cancel()
    await store.aclose()
    again = await opener()
    for i in range(4):
        assert _seqs(await (await again.conversations.open(f"c{i}")).read_after(0)) == list(range(1, 61))


async def test_records_ids_and_removal(opener: Opener) -> None:
    store = await opener()
    convs = store.conversations
    assert await convs.ids() == [] and await convs.read_records() == {}
    for cid in ("cb", "ca"):
        j = await convs.open(cid)
        j.append("conversation", b"{}")
        await j.sync()
        convs.write_record(cid, b'{"v":1,"id":"%s"}' % cid.encode())
    convs.write_record("ca", b'{"v":2}')  # the last write wins
    assert await convs.read_record("ca") == b'{"v":2}'
    await (await convs.open("ca")).sync()
    await store.aclose()

    store = await opener()
    convs = store.conversations
    assert await convs.ids() == ["ca", "cb"]
    assert await convs.read_records() == {"ca": b'{"v":2}', "cb": b'{"v":1,"id":"cb"}'}
    await convs.remove("cb")
    await convs.remove("never-was")  # no error
    assert await convs.ids() == ["ca"] and await convs.read_record("cb") is None
    assert await convs.journal_size("cb") == 0
    fresh = await convs.open("cb")
    assert fresh.last_seq == 0 and fresh.append("conversation", b"{}")[0] == 1


async def test_a_record_written_is_read_back_while_its_commit_is_in_flight(opener: Opener, backend: str) -> None:
    """Read your writes: a record taken by a commit that has not returned yet is still this store's
    to read (a host loading the conversation it just made reads its record back)."""
    store = await opener()
    convs = store.conversations
    started, release = trio.Event(), trio.Event()
    if backend == "postgres":
        from agentd.store.postgres.journal import _write

        run = convs.pool.run

        async def slow_run(fn: Any, *args: Any) -> Any:
            if fn is _write:
                started.set()
                await release.wait()
            return await run(fn, *args)

        convs.pool.run = slow_run  # type: ignore[method-assign]
    else:
        started.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(convs.run)
        convs.write_record("ca", b'{"v":1}')
        await started.wait()
        assert await convs.read_record("ca") == b'{"v":1}'
        assert await convs.read_records() == {"ca": b'{"v":1}'}
        assert await convs.ids() == ["ca"]
        release.set()
        await (await convs.open("ca")).sync()
        assert await convs.read_record("ca") == b'{"v":1}'
        nursery.cancel_scope.cancel()


async def test_bad_input_is_refused_and_loses_nothing(store: Store) -> None:
    convs = store.conversations
    for bad in ("../x", "", "a/b", ".hidden"):
        with pytest.raises(Invalid):
            await convs.open(bad)
        with pytest.raises(Invalid):
            convs.write_record(bad, b"{}")
        assert await convs.read_record(bad) is None
    j = await convs.open("c1")
    j.append("item", _payload(1))
    with pytest.raises(ValueError, match="raw newline"):
        j.append("item", b'{"a":\n1}')
    assert j.last_seq == 1
    assert j.append("item", _payload(2))[0] == 2
    await j.sync()
    assert _seqs(await j.read_after(0)) == [1, 2]


async def _damage(backend: str, store: Store, dsn: str, seq: int) -> None:
    """Break the journal of c1 at ``seq`` the way each medium breaks: a garbage line, a missing row."""
    if backend == "file":
        path = store.conversations.root / "c1" / "events.jsonl"
        lines = path.read_bytes().split(b"\n")
        lines[seq - 1] = b"not json at all"
        path.write_bytes(b"\n".join(lines))
    else:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM journal WHERE conversation_id = 'c1' AND seq = %s", (seq,))


async def test_a_damaged_journal_names_the_seq_where_it_breaks(opener: Opener, backend: str, dsn: str) -> None:
    store = await opener()
    j = await store.conversations.open("c1")
    for n in range(1, 11):
        j.append("item", _payload(n))
    await j.sync()
    await store.aclose()
    await _damage(backend, store, dsn, 6)
    store = await opener()
    j = await store.conversations.open("c1")
    assert _seqs(await j.read_after(0, limit=5)) == [1, 2, 3, 4, 5]
    with pytest.raises(JournalCorrupt) as info:
        await j.read_after(3)
    assert info.value.line == 6
    assert _seqs(await j.read_after(6)) == [7, 8, 9, 10]


@pytest.mark.parametrize("backend", ["postgres"])  # on files one writer per state dir is the daemon lock's rule
async def test_a_second_writer_of_the_same_seq_is_refused(opener: Opener) -> None:
    """PostgreSQL: two hosts appending to one conversation (only the lease holder may): the second
    commit of seq n is refused by the primary key, its journal takes no more, the first's rows stand."""
    a, b = await opener(), await opener()
    ja, jb = await a.conversations.open("c1"), await b.conversations.open("c1")
    line = ja.append("item", _payload(1))[1]
    await ja.sync()
    jb.append("item", _payload(99))
    with pytest.raises(OSError, match="refused by the database"):
        await jb.sync()
    with pytest.raises(OSError, match="refused"):
        jb.append("item", _payload(100))
    assert await (await (await opener()).conversations.open("c1")).read_after(0) == [line]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # what only a database does
async def test_a_journal_whose_commit_failed_takes_records_again_once_its_rows_are_committed(
        opener: Opener, backend: str) -> None:
    """PostgreSQL: a commit that failed (the database unreachable) was rolled back; the rows are
    retried, appends are refused meanwhile, and once the rows are in the journal takes records
    again (the store's on_recovered hook says so)."""
    import psycopg

    from agentd.store.postgres.journal import _write

    store = await opener()
    convs = store.conversations
    recovered: list[str] = []
    convs.on_recovered = recovered.append
    run, down = convs.pool.run, [True]

    async def flaky_run(fn: Any, *args: Any) -> Any:
        if fn is _write and down[0]:
            raise psycopg.OperationalError("the server is gone")
        return await run(fn, *args)

    convs.pool.run = flaky_run  # type: ignore[method-assign]
    j = await convs.open("c1")
    j.append("item", _payload(1))
    with pytest.raises(OSError, match="could not be committed"):
        await j.sync()
    with pytest.raises(OSError, match="could not be committed"):
        j.append("item", _payload(2))
    down[0] = False
    async with trio.open_nursery() as nursery:
        await nursery.start(convs.run)
        with trio.fail_after(10):
            while not recovered:
                await trio.sleep(0.01)
        assert recovered == ["c1"]
        assert j.append("item", _payload(2))[0] == 2
        await j.sync()
        nursery.cancel_scope.cancel()
    assert _seqs(await (await (await opener()).conversations.open("c1")).read_after(0)) == [1, 2]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # what only a database does
async def test_rows_of_a_host_whose_lease_was_taken_over_are_refused_not_committed_ahead_of_the_new_holder(
        opener: Opener, backend: str) -> None:
    """PostgreSQL, hosts sharing it (``fence``: the lease owner): a host that stalled past its TTL and
    appends before it notices the takeover must not commit rows the new holder has not read (the new
    holder's own seqs would then be refused); its commit is refused and the new holder's stand."""
    a, b = await opener(), await opener()
    a.conversations.fence, b.conversations.fence = a.leases.owner, b.leases.owner
    await a.leases.acquire("c1")
    ja = await a.conversations.open("c1")
    first = ja.append("item", _payload(1))[1]
    await ja.sync()
    # A stalls; its lease expires and B takes it over, before writing anything.
    await a.conversations.pool.execute("UPDATE leases SET expires_at = now() - interval '1 second'")
    assert (await b.leases.acquire("c1")).action == "taken_over"
    jb = await b.conversations.open("c1")
    ja.append("item", _payload(2))  # A wakes and appends seq 2 before it renews
    with pytest.raises(OSError, match="no longer holds the lease"):
        await ja.sync()
    line = jb.append("item", _payload(3))[1]
    await jb.sync()
    assert await (await (await opener()).conversations.open("c1")).read_after(0) == [first, line]
