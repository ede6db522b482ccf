"""Cross-host wake-up through PostgreSQL: a commit with NOTIFY on one host -> a watch woken on another.

Host A commits a transaction that sends a notification (``agentd.store.postgres.notify`` through its
:class:`~agentd.store.postgres.Pool`, a worker thread); host B's
:class:`~agentd.store.postgres.Listener` is woken by trio on its socket and hands the notification to
a :class:`~agentd.store.postgres.Watch`. The clock runs from the call on A to the wake-up on B, so it
holds A's thread hop and commit round trip, the server's delivery, and B's dispatch: the floor under
any cross-host ``subscribe`` (which then reads the new rows). Both hosts are pools in this process
against a throwaway local cluster (tests/pgcluster.py, fsync off). The baseline is one ``SELECT 1``
through the same pool: what any database call costs here.
"""

from __future__ import annotations

import time

import trio

from ._common import Ctx, Result, percentile

CHANNEL = "agentd_bench"


async def _measure(dsn: str, n: int) -> tuple[list[float], list[float]]:
    from agentd.store.postgres import Listener, Pool, notify

    lat: list[float] = []
    base: list[float] = []
    listener = Listener(dsn, [CHANNEL])
    async with Pool(dsn, size=2) as pool, trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        with listener.watch() as watch:
            for i in range(n):
                t0 = time.perf_counter()
                await pool.run(notify, CHANNEL, str(i))
                while (got := await watch.next()) is None or got.payload != str(i):
                    pass
                lat.append((time.perf_counter() - t0) * 1e6)
                t0 = time.perf_counter()
                await pool.execute("SELECT 1")
                base.append((time.perf_counter() - t0) * 1e6)
        nursery.cancel_scope.cancel()
    return lat, base


def bench_pg_notify(ctx: Ctx) -> list[Result]:
    from ..pgcluster import PgCluster, find_bindir

    n, repeats = (200, 1) if ctx.quick else (2000, 3)
    bindir = find_bindir()
    if bindir is None:
        return [Result("cross-host notify -> wake, p50", "us", skipped="PostgreSQL is not installed "
                                                                        "(apt-get install postgresql)")]
    cluster = PgCluster(bindir).start()
    p50, p99, b50, b99 = [], [], [], []
    try:
        for _ in range(repeats):
            db = cluster.create_database()
            lat, base = trio.run(_measure, cluster.dsn(db), n)
            cluster.drop_database(db)
            p50.append(percentile(lat, 50))
            p99.append(percentile(lat, 99))
            b50.append(percentile(base, 50))
            b99.append(percentile(base, 99))
    finally:
        cluster.stop()
    r50 = Result("cross-host notify -> wake (PostgreSQL), p50", "us", p50, b50, baseline_name="SELECT 1 via the pool",
                 higher=False)
    r99 = Result("cross-host notify -> wake (PostgreSQL), p99", "us", p99, b99, baseline_name="SELECT 1 via the pool",
                 higher=False)
    for r in (r50, r99):
        r.notes.append(f"{n} commits with NOTIFY, one at a time, {repeats} repeats; local cluster, Unix socket")
    return [r50, r99]
