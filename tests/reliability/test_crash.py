"""CI's share of the crash harness (see crash.py): 50 SIGKILLs of the real daemon on the file store (the full
run is 1,000), and 15 on the postgres store (fsync batch) against a real PostgreSQL (the documented run is
1,000 too).

``AGENTD_CRASH_SEED`` and ``AGENTD_CRASH_KILLS`` override the seed and the count of the file run,
``AGENTD_CRASH_PG_SEED`` and ``AGENTD_CRASH_PG_KILLS`` those of the postgres run.
"""

from __future__ import annotations

import os
from pathlib import Path

from pgcluster import PgDatabase

from .crash import CrashHarness


def test_fifty_sigkills_lose_no_acknowledged_event_and_resend_no_prompt(tmp_path: Path) -> None:
    seed = int(os.environ.get("AGENTD_CRASH_SEED", "5"))
    kills = int(os.environ.get("AGENTD_CRASH_KILLS", "50"))
    harness = CrashHarness(tmp_path, seed=seed, log=lambda s: None)
    try:
        figures = harness.run(kills)
    finally:
        harness.close()
    assert figures.kills == kills
    # The kills landed where they were meant to.
    assert figures.modes["append"] and figures.modes["answer"] and figures.modes["lease"] and figures.modes["startup"]
    assert figures.runs_interrupted > 0 and figures.events_checked > 0 and figures.answers_acked > 0


def test_sigkills_on_the_postgres_store_lose_no_acknowledged_record_and_resend_no_prompt(
        tmp_path: Path, pg_db: PgDatabase) -> None:
    seed = int(os.environ.get("AGENTD_CRASH_PG_SEED", "2"))
    kills = int(os.environ.get("AGENTD_CRASH_PG_KILLS", "15"))
    # fsync batch, the shipped default: on postgres a record is published only once committed even then
    # (the file store publishes once written), so acknowledged still means in the database.
    harness = CrashHarness(tmp_path, seed=seed, log=lambda s: None, store="postgres", dsn=pg_db.dsn, fsync="batch")
    try:
        figures = harness.run(kills)
    finally:
        harness.close()
    assert figures.kills == kills
    assert figures.modes["append"] and figures.modes["answer"] and figures.modes["commit"] and figures.modes["startup"]
    # Some commit kill landed right after a commit's NOTIFY, not at its deadline.
    assert figures.commit_kills_hit > 0 and figures.commits_seen > 0
    assert figures.runs_interrupted > 0 and figures.events_checked > 0 and figures.answers_acked > 0
    # A row rendered by line_of is the file journal's line byte for byte (scale-out.md says so).
    assert figures.records_reformatted == 0
    # Nothing of the journals went to the state dir (the checks read the database, not stale files).
    assert not list((tmp_path / "state" / "conversations").glob("*/events.jsonl"))
