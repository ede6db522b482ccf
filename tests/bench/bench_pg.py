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
from typing import Any

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


def _arrivals(client: Any, conversation: str, out: dict[int, float], stop: Any) -> None:
    """Record when each durable record of ``conversation`` arrives on ``client`` (perf_counter s)."""
    from agentd import wire

    client.subscribe(conversation, after=0, snapshot=False)
    try:
        for frame in client.frames(timeout=120):
            if isinstance(frame, wire.EventFrame):
                seq = wire.decode_record(frame.record).seq
                if seq:
                    out.setdefault(seq, time.perf_counter())
            if stop.is_set():
                return
    except (EOFError, OSError):
        if not stop.is_set():
            raise  # cut off before the bench was done with it


def _end(client: Any) -> None:
    """Wake a reader blocked on ``client`` (close alone does not) and close it."""
    import socket

    try:
        client.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    client.close()


def bench_cross_host(ctx: Ctx) -> list[Result]:
    """Two real agentd hosts on one database: a record's arrival at a subscriber on the host that
    runs the conversation, then at a subscriber on the other host (relayed through the database)."""
    import threading

    from agentd import wire

    from ..pgcluster import PgCluster, find_bindir
    from ._common import REPO, Client, Daemon

    turns = 10 if ctx.quick else 60
    bindir = find_bindir()
    names = ("cross-host emit -> receive (PostgreSQL), p50", "cross-host emit -> receive (PostgreSQL), p99")
    if bindir is None:
        return [Result(n, "us", skipped="PostgreSQL is not installed (apt-get install postgresql)") for n in names]
    cluster = PgCluster(bindir).start()
    hosts: list[Any] = []
    try:
        db = cluster.create_database()
        config = f'[store]\nbackend = "postgres"\ndsn = "{cluster.dsn(db)}"\n'
        for name in ("a", "b"):
            root = ctx.scratch(f"cross-host-{name}")
            hosts.append(Daemon(root, config).start())
        a, b = hosts
        work = a.root / "work"
        work.mkdir(exist_ok=True)
        with Client(a.socket) as ca:
            cid = ca.request(wire.New, provider="script", workdir=str(work),
                             model=str(REPO / "conf" / "scripts" / "echo.toml"))["id"]
            deadline = time.monotonic() + 30
            while True:  # B knows it once its record's NOTIFY came
                try:
                    with Client(b.socket) as cb:
                        cb.request(wire.Show, conversation=cid)
                    break
                except Exception:
                    assert time.monotonic() < deadline, "host B never saw the conversation"
                    time.sleep(0.05)
            at_a: dict[int, float] = {}
            at_b: dict[int, float] = {}
            stop = threading.Event()
            sa, sb = Client(a.socket), Client(b.socket)
            readers = [threading.Thread(target=_arrivals, args=(c, cid, out, stop), daemon=True)
                       for c, out in ((sa, at_a), (sb, at_b))]
            for t in readers:
                t.start()
            for i in range(turns):
                ca.request(wire.Send, conversation=cid, text=f"turn {i}")
                deadline = time.monotonic() + 30
                while ca.request(wire.Show, conversation=cid)["record"].get("active_run"):
                    assert time.monotonic() < deadline, "a turn did not end"
                    time.sleep(0.01)
            deadline = time.monotonic() + 10
            while max(at_a, default=0) > max(at_b, default=0) and time.monotonic() < deadline:
                time.sleep(0.01)
            stop.set()
            for c in (sa, sb):
                _end(c)
            for t in readers:
                t.join(10)
        lat = [(at_b[s] - at_a[s]) * 1e6 for s in at_a if s in at_b]
        missing = sorted(set(at_a) - set(at_b))
        floor, _ = trio.run(_measure, cluster.dsn(db), 200 if ctx.quick else 1000)
    finally:
        for d in hosts:
            d.stop()
        cluster.stop()
    r50 = Result(names[0], "us", [percentile(lat, 50)], [percentile(floor, 50)],
                 baseline_name="notify -> wake floor", higher=False)
    r99 = Result(names[1], "us", [percentile(lat, 99)], [percentile(floor, 99)],
                 baseline_name="notify -> wake floor", higher=False)
    for r in (r50, r99):
        r.notes.append(f"{len(lat)} durable records of {turns} script turns, a subscriber on each host; "
                       "from the arrival on the host that runs the conversation to the arrival on the other")
        if missing:
            r.notes.append(f"{len(missing)} records never reached the other host: {missing[:5]}")
    return [r50, r99]
