"""Two hosts on one PostgreSQL, as separate processes: host A holds leases and renews them; SIGKILL
of A is noticed by B and C only when A's leases expire (by the database clock), and each of A's
conversations is then taken over by exactly one of them, told it was A's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import trio

from agentd.leases import LeaseHeld
from agentd.store.postgres import Pool, migrate
from agentd.store.postgres._leases import PgLeaseStore
from daemon_harness import REPO
from pgcluster import PgDatabase

TTL_S = 3.0
KEYS = [f"c{i}" for i in range(5)]

HOST_A = """
import sys, trio
from agentd.store.postgres import Pool
from agentd.store.postgres._leases import PgLeaseStore

async def main(dsn, ttl, keys):
    async with Pool(dsn, size=1) as pool:
        store = PgLeaseStore(pool, owner="hostA", ttl_s=ttl)
        for k in keys:
            await store.acquire(k)
        async with trio.open_nursery() as n:
            await n.start(store.run)
            print("ready", flush=True)
            await trio.sleep_forever()

trio.run(main, sys.argv[1], float(sys.argv[2]), sys.argv[3:])
"""


@pytest.fixture
def host_a(pg_db: PgDatabase):
    async def prepare() -> None:
        async with Pool(pg_db.dsn, size=1) as pool:
            await migrate(pool)

    trio.run(prepare)
    proc = subprocess.Popen([sys.executable, "-c", HOST_A, pg_db.dsn, str(TTL_S), *KEYS], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_host_is_taken_over_after_its_ttl_once_per_conversation(pg_db: PgDatabase, host_a) -> None:
    async def main() -> tuple[float, dict[str, list[tuple[str, str, bool]]]]:
        async with Pool(pg_db.dsn, size=2) as pb, Pool(pg_db.dsn, size=2) as pc:
            b = PgLeaseStore(pb, owner="hostB", ttl_s=TTL_S)
            c = PgLeaseStore(pc, owner="hostC", ttl_s=TTL_S)
            await trio.sleep(TTL_S * 1.2)  # longer than a TTL: only A's renewal keeps its leases
            for k in KEYS:
                with pytest.raises(LeaseHeld):
                    await b.acquire(k)
            host_a.send_signal(signal.SIGKILL)
            host_a.wait()
            killed = time.monotonic()
            with pytest.raises(LeaseHeld):  # renewed at most TTL/3 ago: still A's for 2/3 of a TTL
                await b.acquire(KEYS[0])
            wins: dict[str, list[tuple[str, str, bool]]] = {k: [] for k in KEYS}

            async def take(store: PgLeaseStore, key: str) -> None:
                while not wins[key]:
                    try:
                        outcome = await store.acquire(key)
                    except LeaseHeld as exc:
                        if exc.lease.owner != "hostA":
                            return  # the other survivor won it
                        await trio.sleep(0.05)
                        continue
                    wins[key].append((store.owner, outcome.previous_owner, outcome.previous_expired))

            with trio.fail_after(TTL_S * 4):
                async with trio.open_nursery() as n:
                    for k in KEYS:
                        n.start_soon(take, b, k)
                        n.start_soon(take, c, k)
            return time.monotonic() - killed, wins

    took, wins = trio.run(main)
    assert took <= TTL_S + 2.0
    for k, w in wins.items():
        assert len(w) == 1, (k, w)
        owner, previous, expired = w[0]
        assert owner in ("hostB", "hostC") and previous == "hostA" and expired
