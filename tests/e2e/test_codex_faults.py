"""Issue 13's failure classes on the real Codex app-server, through the real daemon and agentctl.

What the model alone cannot make Codex do (a kind a newer Codex would send, a line over the
reader's ceiling, a cancel it never confirms) is added by tests/e2e/codex_fault_proxy.py, a
relay between agentd and the real ``codex app-server`` (its ``cli_path``); everything else is
Codex's own behaviour against the scripted model server.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from acp_agents import codex_shell_arguments
from conformance import Follower, _json
from daemon_harness import Daemon
from runtimes_e2e import CodexRuntime, q

pytestmark = pytest.mark.e2e

PROXY = pathlib.Path(__file__).with_name("codex_fault_proxy.py")
GRACE_S = 3.0


class Faulty:
    def __init__(self, rt: CodexRuntime, root: pathlib.Path) -> None:
        self.rt = rt
        self.control = root / "codex-faults.json"
        wrapper = root / "codex-with-faults"
        cli = rt.config_toml.split("cli_path = ", 1)[1].split("\n", 1)[0]
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {PROXY} {self.control} {cli} \"$@\"\n")
        wrapper.chmod(0o700)
        config = rt.config_toml.replace(f"cli_path = {cli}", f"cli_path = {q(str(wrapper))}")
        config = config.replace("[providers.codex]\n", f"[providers.codex]\ncancel_timeout_s = {GRACE_S}\n", 1)
        self.config = f"[runtimes]\ncancel_timeout_s = {GRACE_S}\n" + config

    def faults(self, **faults: Any) -> None:
        self.control.write_text(json.dumps(faults))


@pytest.fixture
def faulty(tmp_path: pathlib.Path) -> Iterator[Faulty]:
    rt = CodexRuntime(tmp_path)
    try:
        yield Faulty(rt, tmp_path)
    finally:
        rt.close()


@pytest.fixture
def daemon(faulty: Faulty, tmp_path: pathlib.Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, faulty.config, env=faulty.rt.env).start()
    try:
        yield d
    finally:
        d.stop()


def _new(d: Daemon, workdir: pathlib.Path, *extra: str) -> str:
    return _json(d.agentctl("new", "-p", "codex", "--cwd", str(workdir), "--json", *extra))["id"]


def _ends(d: Daemon, cid: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in d.journal(cid):
        if r["type"] == "turn" and r["data"]["state"] in ("completed", "failed", "cancelled"):
            out.setdefault(r.get("run", ""), []).append(r["data"])
    return out


def _text_turn(d: Daemon, faulty: Faulty, cid: str, text: str) -> dict[str, Any]:
    assert faulty.rt.server is not None
    faulty.rt.server.reset()
    faulty.rt.server.answer_text_only(text)
    follower = Follower(d, cid, f"Say {text}")
    follower.finish(timeout=120)
    return [r for r in d.journal(cid) if r["type"] == "turn"][-1]["data"]


def test_unknown_codex_notifications_and_items_are_unknown_records_warned_once_and_shown_by_tail(
        faulty: Faulty, daemon: Daemon, workdir: pathlib.Path) -> None:
    faulty.faults(unknown=True)
    cid = _new(daemon, workdir)
    for n in (1, 2):
        assert _text_turn(daemon, faulty, cid, f"answer {n}")["state"] == "completed"
    unknown = [r["data"] for r in daemon.journal(cid) if r["type"] == "unknown"]
    assert sorted(u["type"] for u in unknown) == ["item/futureItem"] * 2 + ["thread/futureThing/updated"] * 2, unknown
    assert all(u["provider"] == "codex" for u in unknown)
    note = next(u for u in unknown if u["type"] == "thread/futureThing/updated")
    assert note["data"]["level"] == 7 and note["data"]["threadId"], note  # verbatim
    item = next(u for u in unknown if u["type"] == "item/futureItem")
    assert item["data"]["detail"] == "from a newer Codex", item
    warnings = [json.loads(line) for line in daemon.log.read_text().splitlines() if "runtime.unknown_kind" in line]
    assert sorted(w["type"] for w in warnings) == ["item/futureItem", "thread/futureThing/updated"], warnings
    assert all(w["level"] == "warning" for w in warnings)
    tail = daemon.agentctl("tail", cid, "--no-follow")
    assert tail.returncode == 0, tail.stderr
    assert "'thread/futureThing/updated'" in tail.stdout and "'item/futureItem'" in tail.stdout, tail.stdout
    assert "answer 2" in tail.stdout


def test_a_line_of_70_mib_fails_the_turn_naming_its_size_and_the_ceiling_and_the_next_prompt_works(
        faulty: Faulty, daemon: Daemon, workdir: pathlib.Path) -> None:
    faulty.faults(big_line=70 << 20)
    cid = _new(daemon, workdir)
    end = _text_turn(daemon, faulty, cid, "never seen")
    assert end["state"] == "failed", end
    assert "67,108,864 bytes (64 MiB)" in end["error"] and "bytes (read so far" in end["error"], end
    faulty.faults()
    again = _text_turn(daemon, faulty, cid, "back again")
    assert again["state"] == "completed", again
    texts = [r["data"].get("text", "") for r in daemon.journal(cid) if r["type"] == "item"]
    assert "back again" in texts[-1] and not any("xxxx" in t for t in texts)
    assert all(len(e) == 1 for e in _ends(daemon, cid).values()), _ends(daemon, cid)


def test_a_cancel_codex_never_confirms_ends_cancel_timeout_agentctl_says_so_and_the_next_prompt_is_not_busy(
        faulty: Faulty, daemon: Daemon, workdir: pathlib.Path) -> None:
    assert faulty.rt.server is not None
    faulty.faults(drop_interrupt=True)
    # A turn running in Codex with nothing asked (an expired approval would be Codex's own end):
    # an answer streamed one word every 0.5 s, for longer than the test waits.
    faulty.rt.server.answer_text_only(" ".join(f"word{n}" for n in range(60)))
    faulty.rt.server.stream_slowly(0.5)
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Talk slowly")
    follower.wait_for(lambda line: line.get("type") == "delta")
    run = next(r["run"] for r in daemon.journal(cid) if r["type"] == "prompt")
    t0 = time.monotonic()
    cp = daemon.agentctl("cancel", cid, "--json")
    took = time.monotonic() - t0
    follower.finish(timeout=30)
    assert cp.returncode == 9, (cp.returncode, cp.stdout, cp.stderr)
    out = json.loads(cp.stdout)
    assert (out["run"], out["state"], out["reason"], out["inferred"]) == (run, "cancelled", "cancel_timeout", True), out
    assert took < 2 * GRACE_S + 10, took
    faulty.faults()
    again = _text_turn(daemon, faulty, cid, "after the cancel")
    assert again["state"] == "completed", again
    ends = _ends(daemon, cid)
    assert all(len(e) == 1 for e in ends.values()) and "" not in ends, ends
    assert ends[run][0]["reason"] == "cancel_timeout", ends
    later = [r["data"]["text"] for r in daemon.journal(cid)
             if r["type"] == "item" and r["data"]["kind"] == "assistant" and r.get("run") != run]
    assert later and "after the cancel" in later[-1] and "word" not in later[-1], later


def test_a_tool_call_id_codex_reuses_in_a_later_turn_is_a_new_item_and_the_first_stays_as_it_was(
        faulty: Faulty, daemon: Daemon, workdir: pathlib.Path) -> None:
    assert faulty.rt.server is not None
    cid = _new(daemon, workdir, "--yolo")
    for n in (1, 2):
        faulty.rt.server.reset()
        faulty.rt.server.call_tool("exec_command", arguments=codex_shell_arguments(f"echo turn-{n}"),
                                   call_id="call_reused")
        assert Follower(daemon, cid, f"Run command {n}").finish(timeout=120) == 0
    latest: dict[str, dict[str, Any]] = {}
    for r in daemon.journal(cid):
        if r["type"] == "item" and r["data"]["kind"] == "tool":
            latest[r["data"]["id"]] = r["data"]
    ran = {i: t for i, t in latest.items() if "call_reused" in i}
    assert len(ran) == 2, latest
    outputs = sorted(t["tool"]["output"].strip() for t in ran.values())
    assert outputs == ["turn-1", "turn-2"], ran
    export = daemon.agentctl("export", cid, "--include-tools")
    assert export.returncode == 0, export.stderr
    assert "turn-1" in export.stdout and "turn-2" in export.stdout
