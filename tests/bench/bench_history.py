"""Benchmark of ``history``: the first page of a long conversation, through the daemon."""

from __future__ import annotations

import time

from agentd import wire

from ._common import BenchDaemon, Ctx, Result
from ._state import write_turns_journal
from .bench_state import _last_lines


def bench_history(ctx: Ctx) -> Result:
    events, repeats = (20_000, 5) if ctx.quick else (100_000, 20)
    root = ctx.scratch("history")
    daemon = BenchDaemon(root, "")
    cid = write_turns_journal(daemon.state_dir, events)
    path = daemon.state_dir / "conversations" / cid / "events.jsonl"
    samples, base, older = [], [], []
    daemon.start()
    try:
        with daemon.client() as client:
            client.request(wire.Show, conversation=cid)  # resolve once: the journal's first open is not paged
            for _ in range(repeats):
                t0 = time.perf_counter()
                page = client.request(wire.History, conversation=cid, limit=50)
                samples.append((time.perf_counter() - t0) * 1000)
                assert len(page["items"]) == 50, page
                t0 = time.perf_counter()
                client.request(wire.History, conversation=cid, limit=50, before=events // 2)
                older.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                lines = _last_lines(path, 70)  # the records those 50 items come from
                base.append((time.perf_counter() - t0) * 1000)
                assert len(lines) == 70
    finally:
        daemon.stop()
    r = Result(f"history: first page of 50 items of a {events:,}-record journal", "ms", samples, base,
               baseline_name="read the last 70 lines of the file", higher=False, target="<= 20 ms")
    r.met = r.median is not None and r.median <= 20
    mid = sorted(older)[len(older) // 2]
    r.extra["middle_page_ms"] = mid
    r.notes.append(f"a page from the middle (before seq {events // 2:,}): {mid:.1f} ms (median); {repeats} repeats, "
                   "each a request on one connection to a running daemon")
    return r
