"""CI's share of the crash harness: 50 SIGKILLs of the real daemon (see crash.py; the full run is 1,000).

``AGENTD_CRASH_SEED`` and ``AGENTD_CRASH_KILLS`` override the seed and the count.
"""

from __future__ import annotations

import os
from pathlib import Path

from .crash import CrashHarness


def test_fifty_sigkills_lose_no_acknowledged_event_and_resend_no_prompt(tmp_path: Path) -> None:
    seed = int(os.environ.get("AGENTD_CRASH_SEED", "5"))
    kills = int(os.environ.get("AGENTD_CRASH_KILLS", "50"))
    harness = CrashHarness(tmp_path, seed=seed, log=lambda s: None)
    try:
        figures = harness.run(kills)
    finally:
        if harness.daemon.proc is not None and harness.daemon.proc.poll() is None:
            harness.daemon.proc.kill()
    assert figures.kills == kills
    # The kills landed where they were meant to.
    assert figures.modes["append"] and figures.modes["answer"] and figures.modes["lease"] and figures.modes["startup"]
    assert figures.runs_interrupted > 0 and figures.events_checked > 0 and figures.answers_acked > 0
