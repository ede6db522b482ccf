"""Journal append through the store interface: PostgreSQL against the file store, in one run.

Each store is opened by :func:`agentd.store.open_store` from a ``Config``, as the daemon opens it
(``[journal] fsync = "batch"``, ``batch_ms`` :data:`BATCH_MS`; for ``postgres`` the pool is
connected and the schema migrated first, outside the clock), and runs its background loops
(``Store.run``: the group commit) beside the producer. The producer appends records of about 200
bytes to one conversation's journal, yielding to trio every ``YIELD_EVERY`` records as the
conversation pump does (bench_journal.py), then awaits ``journal.sync()``; the clock stops once the
last record is durable: fsynced for the file store, committed for PostgreSQL (the group commit's
COPY into ``journal``, a transaction every ``batch_ms`` while appends come, in a worker thread).

The PostgreSQL cluster is a throwaway one from tests/pgcluster.py, on a Unix socket, run with
``fsync=off`` and ``synchronous_commit=off``: a COMMIT returns without a WAL flush, so the figure
is the store's and the server's work without the disk, an upper bound of what a real server (WAL
flushed on commit) reaches. Each repeat gets a fresh database and a fresh state dir; the file and
PostgreSQL runs alternate repeat by repeat.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import trio

from agentd.config import Config, JournalConfig, Paths, StoreConfig
from agentd.store import open_store

from ._common import Ctx, Result
from .bench_journal import YIELD_EVERY, append_burst

BATCH_MS = 5.0
CONVERSATION = "c0123456789ab"


async def _append_run(backend: str, dsn: str, state: Path, n: int, cpu: list[float]) -> tuple[float, int]:
    """Records/s of ``n`` appends then ``sync()`` through the ``backend`` store, and the length of a
    record's line (bytes); the CPU per record (us) goes to ``cpu``. Raises RuntimeError when the store
    does not hold the ``n`` records afterwards."""
    config = Config(store=StoreConfig(backend=backend, dsn=dsn),  # type: ignore[arg-type]
                    journal=JournalConfig(fsync="batch", batch_ms=BATCH_MS))
    paths = Paths(state_dir=state, runtime_dir=state, socket=state / "s", token_file=state / "t")
    store = await open_store(config, paths, owner="bench")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            journal = await store.conversations.open(CONVERSATION)
            t0 = time.perf_counter()
            c0 = time.process_time()
            await append_burst(journal, n)
            elapsed = time.perf_counter() - t0
            cpu.append((time.process_time() - c0) / n * 1e6)
            nursery.cancel_scope.cancel()
        # What the clock claimed is durable is there: n records, seq 1..n, the last one readable back.
        last = await journal.read_after(n - 1)
        if len(last) != 1:
            raise RuntimeError(f"{backend} journal: {len(last)} records after seq {n - 1}, expected 1")
        if store.conversations.capabilities.backend == "postgres":
            rows = await store.conversations.pool.execute(  # type: ignore[attr-defined]
                "SELECT count(*), max(seq) FROM journal WHERE conversation_id = %s", (CONVERSATION,))
            if tuple(rows[0]) != (n, n):
                raise RuntimeError(f"postgres journal holds (count, max seq) {tuple(rows[0])}, expected ({n}, {n})")
        elif journal.last_seq != n or await store.conversations.journal_size(CONVERSATION) != journal.size:
            raise RuntimeError(f"file journal at seq {journal.last_seq}, expected {n}, or not all of it synced")
    finally:
        await store.aclose()
    return n / elapsed, len(last[0]) + 1  # + the newline of a file journal line


def bench_store_append(ctx: Ctx) -> Result:
    from ..pgcluster import PgCluster, find_bindir

    n, repeats = (5_000, 3) if ctx.quick else (100_000, 5)
    name = "journal append via the store, postgres (group commit)"
    bindir = find_bindir()
    if bindir is None:
        return Result(name, "records/s", skipped="PostgreSQL is not installed (apt-get install postgresql)")
    pg: list[float] = []
    file: list[float] = []
    cpu_pg: list[float] = []
    cpu_file: list[float] = []
    line_len = 0
    cluster = PgCluster(bindir).start()
    try:
        for _ in range(repeats):
            rate, line_len = trio.run(_append_run, "file", "", _state(ctx), n, cpu_file)
            file.append(rate)
            db = cluster.create_database()
            try:
                pg.append(trio.run(_append_run, "postgres", cluster.dsn(db), _state(ctx), n, cpu_pg)[0])
            finally:
                cluster.drop_database(db)
        version = cluster.version
    finally:
        cluster.stop()
    r = Result(name, "records/s", pg, file, baseline_name=f"file store, fsync batch {BATCH_MS:g} ms")
    r.notes.append(
        f"{n} records of {line_len} bytes per repeat, {repeats} repeats, one conversation, appended "
        f"{YIELD_EVERY} between yields, then `await journal.sync()`; ratio = postgres / file; stores opened by "
        f"open_store with [journal] fsync=batch, batch_ms={BATCH_MS:g}, their group commit (Store.run) running")
    r.notes.append(
        f"PostgreSQL {version} is tests/pgcluster.py's throwaway cluster on a Unix socket, run with fsync=off and "
        "synchronous_commit=off (no WAL flush at COMMIT): the postgres figure leaves out the disk, which the file "
        "store's fsyncs include; a server with synchronous_commit=on would be slower by its WAL flushes")
    r.notes.append(
        f"CPU of the agentd process per record (all its threads, median; the postgres server's own CPU not "
        f"counted): postgres {statistics.median(cpu_pg):.1f} us, file {statistics.median(cpu_file):.1f} us")
    return r


def _state(ctx: Ctx) -> Path:
    state = ctx.scratch("store-append")
    state.chmod(0o700)
    return state
