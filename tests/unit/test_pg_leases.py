"""PostgreSQL leases (agentd.store.postgres._leases) against a real server: expiry by the database's
clock, two owners racing for one key, takeover of a dead owner's leases, batched renewal, lost leases."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from agentd.contract import NotFound
from agentd.leases import LeaseHeld
from agentd.store.postgres import Pool, migrate
from agentd.store.postgres._leases import PgLeaseStore
from pgcluster import PgDatabase


@pytest.fixture
async def pools(pg_db: PgDatabase) -> AsyncIterator[tuple[Pool, Pool]]:
    """Two pools on one migrated database: two hosts."""
    async with Pool(pg_db.dsn, size=2) as a, Pool(pg_db.dsn, size=2) as b:
        await migrate(a)
        yield a, b


def _stores(pools: tuple[Pool, Pool], ttl_s: float = 30.0) -> tuple[PgLeaseStore, PgLeaseStore]:
    return (PgLeaseStore(pools[0], owner="hostA.1", ttl_s=ttl_s, providers=["script"]),
            PgLeaseStore(pools[1], owner="hostB.2", ttl_s=ttl_s))


async def test_acquire_renew_release_get_and_held(pools: tuple[Pool, Pool]) -> None:
    a, _ = _stores(pools)
    assert (await a.acquire("c1", data={"provider": "script"})).action == "acquired"
    assert (await a.acquire("c1")).action == "renewed"
    lease = await a.get("c1")
    assert lease is not None and lease.owner == "hostA.1" and not lease.expired and lease.data == {}
    assert a.held() == ["c1"]
    await a.renew("c1")
    await a.release("c1")
    await a.release("c1")  # idempotent
    assert a.held() == [] and await a.get("c1") is None
    with pytest.raises(NotFound):
        await a.renew("c1")


async def test_release_in_a_cancelled_scope_still_releases(pools: tuple[Pool, Pool]) -> None:
    a, b = _stores(pools)
    await a.acquire("c1")
    with trio.CancelScope() as scope:
        scope.cancel()
        await a.release("c1")
    assert await a.get("c1") is None
    assert (await b.acquire("c1")).action == "acquired"


async def test_a_live_lease_of_another_owner_is_held(pools: tuple[Pool, Pool]) -> None:
    a, b = _stores(pools)
    await a.acquire("c1")
    with pytest.raises(LeaseHeld) as err:
        await b.acquire("c1")
    assert err.value.lease.owner == "hostA.1"
    with pytest.raises(LeaseHeld):
        await b.renew("c1")
    await b.release("c1")  # never touches A's
    assert (await a.get("c1")).owner == "hostA.1"


async def test_expiry_is_the_databases_clock_not_ours(pools: tuple[Pool, Pool], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _stores(pools, ttl_s=0.5)
    await a.acquire("c1")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this host's clock jumps an hour
    with pytest.raises(LeaseHeld):
        await b.acquire("c1")
    monkeypatch.undo()
    await trio.sleep(0.7)  # the database's clock passes the expiry
    outcome = await b.acquire("c1")
    assert (outcome.action, outcome.previous_owner, outcome.previous_expired) == ("taken_over", "hostA.1", True)
    assert (await b.get("c1")).owner == "hostB.2"


async def test_two_owners_racing_for_one_key_exactly_one_wins(pools: tuple[Pool, Pool]) -> None:
    a, b = _stores(pools)
    keys = [f"race{i}" for i in range(20)]
    wins: dict[str, list[str]] = {k: [] for k in keys}

    async def go(store: PgLeaseStore, key: str) -> None:
        try:
            await store.acquire(key)
            wins[key].append(store.owner)
        except LeaseHeld:
            pass

    async with trio.open_nursery() as n:
        for k in keys:
            n.start_soon(go, a, k)
            n.start_soon(go, b, k)
    assert all(len(w) == 1 for w in wins.values()), wins
    for k in keys:
        assert (await a.get(k)).owner == wins[k][0]


async def test_the_renewal_loop_keeps_leases_and_a_dead_owner_is_taken_over_after_the_ttl(
        pools: tuple[Pool, Pool]) -> None:
    a, b = _stores(pools, ttl_s=0.6)
    await a.acquire("c1")
    await a.acquire("c2")
    async with trio.open_nursery() as n:
        await n.start(a.run)
        await trio.sleep(1.5)  # 2.5 ttls: only renewal keeps them
        with pytest.raises(LeaseHeld):
            await b.acquire("c1")
        n.cancel_scope.cancel()  # host A dies (no release)
    with pytest.raises(LeaseHeld):
        await b.acquire("c1")
    with trio.fail_after(5):
        while not await b.expired():
            await trio.sleep(0.1)
    assert sorted(lease.key for lease in await b.expired()) == ["c1", "c2"]
    assert await a.expired() == []  # its own are not another owner's
    outcome = await b.acquire("c1")
    assert outcome.action == "taken_over" and outcome.previous_owner == "hostA.1" and outcome.previous_expired
    # A comes back (a stall, not a death): its next round finds c1 lost and keeps c2
    assert await a.renew_all() == ["c1"]
    assert a.held() == ["c2"]
    assert not (await a.get("c2")).expired


async def test_a_restart_on_the_same_site_takes_over_at_once(pools: tuple[Pool, Pool]) -> None:
    old = PgLeaseStore(pools[0], owner="hostA.1", site="hostA:/state")
    new = PgLeaseStore(pools[1], owner="hostA.2", site="hostA:/state")
    other = PgLeaseStore(pools[1], owner="hostB.3", site="hostB:/state")
    await old.acquire("c1")
    with pytest.raises(LeaseHeld):
        await other.acquire("c1")
    outcome = await new.acquire("c1")
    assert (outcome.action, outcome.previous_owner, outcome.previous_expired) == ("taken_over", "hostA.1", False)


async def test_hosts_are_listed_with_their_providers_and_retire(pools: tuple[Pool, Pool]) -> None:
    a, b = _stores(pools)
    await a.beat()
    await b.beat()
    hosts = {h.owner: h for h in await a.hosts()}
    assert set(hosts) == {"hostA.1", "hostB.2"}
    assert hosts["hostA.1"].providers == ["script"] and hosts["hostA.1"].alive
    await b.retire()
    assert [h.owner for h in await a.hosts()] == ["hostA.1"]


async def test_sweep_removes_long_dead_hosts_without_leases(pools: tuple[Pool, Pool], pg_db: PgDatabase) -> None:
    a, b = _stores(pools)
    await b.beat()
    await b.acquire("kept")
    await PgLeaseStore(pools[1], owner="gone.9").beat()
    pg_db.execute("UPDATE hosts SET expires_at = now() - interval '2 hours' WHERE owner <> 'hostA.1'")
    assert await a.sweep() == 1  # gone.9; hostB.2 still holds a lease
    assert sorted(h.owner for h in await a.hosts()) == ["hostB.2"]

