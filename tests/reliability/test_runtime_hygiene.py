"""Runtime hygiene: odd bytes, big messages and kinds agentd does not know, through the real daemon.

A real daemon runs ``acp_fault_agent.py`` as ``acp:fault`` (a real process on
stdio); each prompt's first word makes it misbehave (see that file). What a
user would observe is asserted: the journal on disk, ``agentctl tail``, the
daemon's log, and whether the next prompt still works on the same process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from agentd import wire
from daemon_harness import Daemon

from .conftest import fast_daemon
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"


@pytest.fixture(scope="module")
def agentd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("hygiene")
    starts = root / "agent-starts.log"
    config = f"""
[runtimes]
hang_timeout_s = 6.0
[providers.acp.fault]
command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]
env = {{ FAULT_AGENT_LOG = {json.dumps(str(starts))} }}
"""
    d = fast_daemon(root, config).start()
    d.starts = starts  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        d.stop()


def _conversation(d: Daemon, tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    with d.client() as client:
        return client.request(wire.New, provider="acp:fault", workdir=str(work))["id"]


def _turn(d: Daemon, cid: str, text: str, timeout: float = 60) -> dict:
    with d.client() as client:
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text=text)["run"]
        records = client.follow(run, timeout=timeout)
    return msgspec.json.decode(records[-1].data)


def _starts(d: Daemon) -> int:
    path = d.starts  # type: ignore[attr-defined]
    return len(path.read_text().splitlines()) if path.exists() else 0


def _assistant_texts(d: Daemon, cid: str) -> list[str]:
    return [r["data"].get("text", "") for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]


def test_invalid_utf8_and_a_lone_surrogate_become_u_fffd_and_the_turn_completes_on_the_same_agent(
    agentd: Daemon, tmp_path: Path
) -> None:
    cid = _conversation(agentd, tmp_path)
    assert _turn(agentd, cid, "hello")["state"] == "completed"
    starts = _starts(agentd)
    FAULTS["runtime odd bytes"] += 1
    end = _turn(agentd, cid, "oddbytes")
    assert end["state"] == "completed", end
    # One rule: each invalid UTF-8 sequence and each lone surrogate is one U+FFFD; NUL is kept.
    assert "odd \ufffd|\ufffd|\ufffd|\x00 bytes" in _assistant_texts(agentd, cid)
    raw = (agentd.root / "state").rglob("events.jsonl")
    line = next(ln for p in raw for ln in p.read_text(encoding="utf-8").splitlines() if "odd " in ln)
    assert "\\u0000" in line, line  # NUL written as JSON's escape
    # The same process took the next prompt: odd bytes never ended the agent.
    assert _turn(agentd, cid, "after")["state"] == "completed"
    assert "echo:after" in _assistant_texts(agentd, cid)
    assert _starts(agentd) == starts


def test_an_unknown_update_kind_is_journaled_verbatim_shown_by_tail_and_warned_once(
    agentd: Daemon, tmp_path: Path
) -> None:
    cid = _conversation(agentd, tmp_path)
    FAULTS["runtime unknown kind"] += 1
    for _ in range(2):
        assert _turn(agentd, cid, "unknown")["state"] == "completed"
    unknown = [r for r in agentd.journal(cid) if r["type"] == "unknown"]
    assert len(unknown) == 2, unknown
    data = unknown[0]["data"]
    assert data["provider"] == "acp:fault" and data["type"] == "future_thing"
    assert data["data"]["detail"] == {"level": 7, "note": "from the future"}  # verbatim
    assert unknown[0]["run"]
    # A known kind with a field agentd does not know is read as usual.
    assert "known kind, new field" in _assistant_texts(agentd, cid)
    tail = agentd.agentctl("tail", cid, "--no-follow")
    assert tail.returncode == 0, tail.stderr
    assert "'future_thing'" in tail.stdout and "does not know" in tail.stdout, tail.stdout
    warnings = [ln for ln in agentd.log.read_text().splitlines()
                if "runtime.unknown_kind" in ln and "future_thing" in ln]
    assert len(warnings) == 1, warnings
    assert "warn" in warnings[0].lower()


def test_a_message_over_the_ceiling_fails_the_turn_naming_its_size_and_the_ceiling_then_the_next_prompt_works(
    agentd: Daemon, tmp_path: Path
) -> None:
    cid = _conversation(agentd, tmp_path)
    FAULTS["runtime message over 64 MiB"] += 1
    end = _turn(agentd, cid, "bigline", timeout=90)
    assert end["state"] == "failed", end
    assert "67,108,864 bytes (64 MiB)" in end["error"], end  # the ceiling
    assert "bytes (read so far" in end["error"], end  # and the size read
    assert _turn(agentd, cid, "after")["state"] == "completed"


def test_a_tool_output_of_8_mib_is_journaled_as_a_cut_and_kept_whole_for_show_full_and_export(
    agentd: Daemon, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "big.toml"
    # 8 MiB of numbered lines, so a lost or reordered piece shows.
    script.write_text(
        'model = "big"\n[[turn]]\n[[turn.step]]\nkind = "tool"\nname = "bash"\n'
        'command = "seq 1 1000000 | sed s/$/.................../ | head -c 8388608"\n'
        '[[turn.step]]\nkind = "text"\ntext = "done"\n'
    )
    cid = agentd.agentctl("new", "-p", "script", "-m", str(script), "--cwd", str(work), "--json")
    assert cid.returncode == 0, cid.stderr
    cid = json.loads(cid.stdout)["id"]
    expected = b"".join(f"{n}...................\n".encode() for n in range(1, 1000001))[: 8 << 20]
    FAULTS["tool output of 8 MiB"] += 1
    assert _turn(agentd, cid, "go")["state"] == "completed"
    tools = [r["data"] for r in agentd.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"]
    done = tools[-1]["tool"]
    assert done["status"] == "completed"
    assert len(done["output"].encode()) < 128 * 1024  # the journal keeps a display cut ...
    assert done["cut"] > (8 << 20) - 128 * 1024  # ... and says by how much
    full = agentd.agentctl("show", cid, "--item", tools[-1]["id"], "--full")
    assert full.returncode == 0, full.stderr
    assert full.stdout.encode() == expected.rstrip(b"\n") + b"\n"
    shown = agentd.agentctl("show", cid, "--item", tools[-1]["id"])
    assert "bytes of the output left out" in shown.stdout and "--full" in shown.stdout, shown.stdout
    # history, the only human view of the item, names the command with the item's id
    listed = agentd.agentctl("history", cid)
    assert f"bytes of its output cut; all of it: agentctl show {cid} --item {tools[-1]['id']} --full" in listed.stdout
    exported = agentd.agentctl("export", cid, "--include-tools")
    assert exported.returncode == 0, exported.stderr
    assert expected.decode().splitlines()[-2] in exported.stdout  # the end of the whole output
    assert expected.decode().splitlines()[1000] in exported.stdout  # and a line the cut left out
    # The conversation takes the next prompt.
    assert _turn(agentd, cid, "again")["state"] == "completed"


def test_whole_outputs_stay_within_the_quota_oldest_first_and_one_over_it_is_not_kept(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path / "quota", "[journal]\ntool_output_quota_bytes = 1048576\n").start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        script = tmp_path / "outputs.toml"
        steps = "".join(f'[[turn.step]]\nkind = "tool"\nname = "bash"\ncommand = "head -c {n} /dev/zero | tr \\\\\\\\0 {ch}"\n'
                        for n, ch in ((600_000, "a"), (600_000, "b"), (2_000_000, "c")))
        script.write_text(f'model = "quota"\n[[turn]]\n{steps}')
        cid = json.loads(d.agentctl("new", "-p", "script", "-m", str(script), "--cwd", str(work), "--json").stdout)["id"]
        assert _turn(d, cid, "go")["state"] == "completed"
        tools = {}
        for r in d.journal(cid):
            if r["type"] == "item" and r["data"]["kind"] == "tool":
                tools[r["data"]["id"]] = r["data"]
        a, b, c = list(tools)
        assert all(t["tool"]["cut"] > 0 for t in tools.values())
        # 600 KB + 600 KB is over 1 MiB: the older one made room for the newer.
        assert d.agentctl("show", cid, "--item", b, "--full").stdout.strip() == "b" * 600_000
        gone = d.agentctl("show", cid, "--item", a, "--full")
        assert gone.returncode == 0 and "was not kept" in gone.stderr and "tool_output_quota_bytes" in gone.stderr
        assert len(gone.stdout) < 100_000  # the display cut only
        # 2 MB is over the whole quota: not kept, and the 600 KB one stays.
        big = d.agentctl("show", cid, "--item", c, "--full")
        assert "was not kept" in big.stderr
        assert d.agentctl("show", cid, "--item", b, "--full").stdout.strip() == "b" * 600_000
        assert "tool_output.over_quota" in d.log.read_text()
        missing = d.agentctl("show", cid, "--item", "no-such-item")
        assert missing.returncode == 6, (missing.returncode, missing.stderr)
    finally:
        d.stop()
