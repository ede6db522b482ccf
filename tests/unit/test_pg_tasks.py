"""PostgreSQL task records and their queue (agentd.store.postgres._tasks) against a real server:
save/load like the file TaskStore, claims by provider with SKIP LOCKED, and a dead host's claims requeued."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import trio

from agentd import wire
from agentd.store.postgres import Pool, migrate
from agentd.store.postgres._leases import PgLeaseStore
from agentd.store.postgres._tasks import PgTaskStore, TaskRecovery
from pgcluster import PgDatabase


def _task(i: int, provider: str = "script", **kw: object) -> wire.TaskRecord:
    ts = f"2026-01-01T00:00:{i:02d}.000Z"
    return wire.TaskRecord(id=f"t{i:02d}", provider=provider, workdir="/w", input=f"do {i}", created_at=ts,
                           updated_at=ts, **kw)  # type: ignore[arg-type]


_COMMENT = wire.TaskComment(id="k1", text="hi", created_at="2026-01-01T00:00:05.000Z")


@pytest.fixture
async def pool(pg_db: PgDatabase) -> AsyncIterator[Pool]:
    async with Pool(pg_db.dsn, size=4) as p:
        await migrate(p)
        yield p


async def test_save_and_load_round_trip_oldest_first(pool: Pool) -> None:
    store = PgTaskStore(pool, owner="a")
    await store.save(_task(2))
    await store.save(_task(1, comments=[_COMMENT]))
    done = _task(2, status=wire.TaskStatus.COMPLETED, result="ok")
    await store.save(done)  # replaces
    assert await store.load() == [_task(1, comments=[_COMMENT]),
                                  done]


async def test_an_unreadable_record_is_skipped(pool: Pool, pg_db: PgDatabase) -> None:
    store = PgTaskStore(pool, owner="a")
    await store.save(_task(1))
    await store.save(_task(2))
    pg_db.execute("UPDATE tasks SET record = 'not json'::bytea WHERE id = 't01'")
    assert [t.id for t in await store.load()] == ["t02"]


async def test_claims_go_to_a_host_offering_the_provider_oldest_first(pool: Pool) -> None:
    a, b = PgTaskStore(pool, owner="a"), PgTaskStore(pool, owner="b")
    await a.save(_task(1, provider="claude"))
    await a.save(_task(2, provider="script"))
    await a.save(_task(3, provider="script"))
    assert await b.claim(["copilot"]) is None
    assert (await b.claim(["script"])).id == "t02"
    assert (await a.claim(["script", "claude"])).id == "t01"
    assert (await a.claim(["script", "claude"])).id == "t03"
    assert await a.claim(["script", "claude"]) is None
    assert [t.id for t in await a.load(claimed_by="b")] == ["t02"]
    # a save (the task starting) keeps the claim
    await b.save(_task(2, provider="script", status=wire.TaskStatus.RUNNING))
    assert [t.id for t in await a.load(claimed_by="b")] == ["t02"]


async def test_hosts_claiming_at_once_never_get_the_same_task(pool: Pool, pg_db: PgDatabase) -> None:
    writer = PgTaskStore(pool, owner="w")
    for i in range(30):
        await writer.save(_task(i))
    async with Pool(pg_db.dsn, size=3) as other:
        stores = [PgTaskStore(pool, owner="a"), PgTaskStore(other, owner="b")]
        got: list[str] = []

        async def claimer(store: PgTaskStore) -> None:
            while (t := await store.claim(["script"])) is not None:
                got.append(t.id)

        async with trio.open_nursery() as n:
            for s in stores * 3:
                n.start_soon(claimer, s)
    assert sorted(got) == [f"t{i:02d}" for i in range(30)]  # each exactly once


async def test_unclaim_and_a_dead_hosts_claims_are_requeued_or_adopted_once(pool: Pool, pg_db: PgDatabase) -> None:
    a, b = PgTaskStore(pool, owner="hostA.1"), PgTaskStore(pool, owner="hostB.2")
    host_a = PgLeaseStore(pool, owner="hostA.1", ttl_s=1.0)
    await host_a.beat()
    await PgLeaseStore(pool, owner="hostB.2", ttl_s=60).beat()
    await PgLeaseStore(pool, owner="hostC.3", ttl_s=60).beat()
    for i in range(3):
        await a.save(_task(i))
    t0, t1, t2 = [await a.claim(["script"]) for _ in range(3)]
    assert await a.unclaim(t0.id) and not await b.unclaim(t0.id)
    running = msgspec.structs.replace(t1, status=wire.TaskStatus.RUNNING)
    await a.save(running)
    await host_a.beat()  # just now: a stall of the steps above cannot make hostA look dead
    assert await b.recover_dead() == TaskRecovery(requeued=[], adopted=[])  # hostA is alive
    await trio.sleep(1.1)  # hostA's heartbeat expires
    async with Pool(pg_db.dsn, size=1) as other:
        c = PgTaskStore(other, owner="hostC.3")
        results = []

        async def recover(store: PgTaskStore) -> None:
            results.append(await store.recover_dead())

        async with trio.open_nursery() as n:
            n.start_soon(recover, b)
            n.start_soon(recover, c)
    assert sorted(r.requeued for r in results) == [[], ["t02"]]
    assert sorted([t.id for t in r.adopted] for r in results) == [[], ["t01"]]  # adopted by one host only
    assert [t.id for t in await b.load(claimed_by="")] == ["t00", "t02"]


async def test_a_previous_instance_of_our_site_is_dead_at_once(pool: Pool) -> None:
    old = PgTaskStore(pool, owner="hostA.1", site="hostA:/state")
    await PgLeaseStore(pool, owner="hostA.1", site="hostA:/state", ttl_s=60).beat()
    await old.save(_task(1))
    await old.claim(["script"])
    other_site = PgTaskStore(pool, owner="hostB.2", site="hostB:/state")
    assert (await other_site.recover_dead()).requeued == []
    new = PgTaskStore(pool, owner="hostA.2", site="hostA:/state")
    assert (await new.recover_dead()).requeued == ["t01"]
