"""A Copilot turn ends exactly once even when the CLI's ``session.idle`` is lost.

Through the real daemon, on the real Copilot CLI (bring-your-own-key, against the scripted
model server), behind ``copilot_lossy.py``: a relay of the CLI's stdio that drops every
``session.idle`` event it sends (the one event the CLI keeps in no record). The turn must
still end from the durable signals (the final ``assistant.turn_end`` and the session's own
state), once, well before the inactivity deadline, and the next prompt must be taken.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import wire
from daemon_harness import Client, Daemon

pytestmark = pytest.mark.e2e

LOSSY = Path(__file__).parent / "copilot_lossy.py"


def _ends(d: Daemon, cid: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in d.journal(cid):
        if rec["type"] == "turn" and rec["data"]["state"] != "working":
            out.setdefault(rec.get("run", ""), []).append(rec["data"])
    return out


def test_a_lost_session_idle_still_ends_the_copilot_turn_once_and_the_next_prompt_is_taken(
    tmp_path: Path, copilot_cli: str, copilot_byok_toml: str, model_server: Any, workdir: Path
) -> None:
    wrapper = tmp_path / "copilot-lossy"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {LOSSY} {copilot_cli} "$@"\n')
    wrapper.chmod(0o755)
    dropped = tmp_path / "dropped.log"
    cli_line = f"cli_path = {json.dumps(copilot_cli)}\n"
    assert cli_line in copilot_byok_toml
    toml = copilot_byok_toml.replace(cli_line, f"cli_path = {json.dumps(str(wrapper))}\n"
                                     f'env = {{ LOSSY_DROP = "session.idle", LOSSY_LOG = {json.dumps(str(dropped))} }}\n')
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", "[providers.claude]\nenabled = false\n" + toml).start()
    try:
        with Client(d.socket, timeout=60.0) as client:  # the CLI's start is slow on a loaded machine
            cid = client.request(wire.New, provider="copilot", workdir=str(workdir))["id"]
            client.subscribe(cid)
            runs = []
            for n, answer in enumerate(["The first answer.", "The second answer."]):
                model_server.answer_text_only(answer)
                t0 = time.monotonic()
                run = client.request(wire.Send, conversation=cid, text=f"prompt {n}")["run"]
                records = client.follow(run, timeout=60)
                took = time.monotonic() - t0
                end = msgspec.json.decode(records[-1].data)
                assert end["state"] == "completed", end
                assert end.get("inferred") is True and end.get("reason") == "end_event_lost", end
                assert took < 30, took  # from the durable signals, not the 600 s inactivity deadline
                print(f"copilot, session.idle dropped: turn {n} ended completed (inferred) {took:.2f} s after the prompt")
                texts = [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]
                assert answer in texts, texts
                runs.append(run)
        assert dropped.read_text().splitlines().count("session.idle") >= 2
        ends = _ends(d, cid)
        assert [len(ends[r]) for r in runs] == [1, 1] and "" not in ends, ends
    finally:
        d.stop()
