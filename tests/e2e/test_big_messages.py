"""Big messages and odd text from real runtimes through the real daemon.

A lone surrogate: the scripted model answers text holding ``\\ud800``; Node
runtimes keep it and write it back as that JSON escape, and the Python SDKs
(``json.loads``) hand agentd a str with a lone surrogate, which msgspec cannot
encode. The journal encoder applies agentd's rule (agentd.runtime_output): the
turn completes, with U+FFFD in its place.

Past agentd's 64 MiB ceiling, from the Copilot CLI: the scripted model answers
65 MiB of text, which the CLI streams in small deltas and then passes on whole
in one ``assistant.message`` event, a JSON-RPC frame over the ceiling. The SDK's
own reader took it whole; agentd's (agentd.providers.copilot._reader) drains it
unheld, and the turn fails with the reader's text (the frame's size and the
ceiling), while the CLI, its connection and another conversation on it go on,
and the next prompt works.

Past the Claude SDK's 1 MiB default reader:

Claude Code writes each message as one stdout line; the SDK's reader stopped at
1 MiB unless told otherwise, so one answer (or tool result) over that ended
the connection and failed the turn. agentd sets the reader's ceiling to its
own 64 MiB (agentd.runtime_output.MAX_MESSAGE_BYTES). Here the scripted model
answers 3 MiB of text: the turn completes with the whole answer journaled and
the next prompt works.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtimes_e2e import RUNTIMES

from daemon_harness import Daemon
from runtimes_e2e import runtime_profile

from agentd.runtime_output import MAX_ITEM_TEXT_CHARS, MAX_MESSAGE_BYTES

pytestmark = pytest.mark.e2e

#: 3 MiB of words, each numbered so a lost piece shows
BIG_TEXT = " ".join(f"w{n:07d}" + "x" * 100 for n in range(29000))


def test_a_3_mib_answer_from_claude_code_completes_the_turn_and_the_next_prompt_works(tmp_path: Path) -> None:
    with runtime_profile("claude", tmp_path) as rt:
        d = Daemon(tmp_path, rt.config_toml, env=rt.env).start()
        try:
            work = tmp_path / "work"
            work.mkdir()
            rt.text_only(BIG_TEXT)
            cid = json.loads(d.agentctl("new", "-p", "claude", "--cwd", str(work), "--json").stdout)["id"]
            sent = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), "send", cid, "Say a lot",
                                   "--follow", "--json"], env=d.env, capture_output=True, text=True, timeout=300)
            ends = [r["data"] for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
            assert ends[-1]["state"] == "completed", ends[-1]
            assert sent.returncode == 0, sent.stderr[-2000:]
            texts = [r["data"].get("text", "") for r in d.journal(cid)
                     if r["type"] == "item" and r["data"]["kind"] == "assistant"]
            assert any(BIG_TEXT.strip() in t for t in texts), [len(t) for t in texts]
            rt.text_only("Short again.")
            again = d.agentctl("send", cid, "And now?", "--follow", "--json", timeout=120)
            assert again.returncode == 0, again.stderr
        finally:
            d.stop()


#: 65 MiB of text in 65 words (the model server streams a word a chunk: 65 deltas, not millions)
HUGE_TEXT = " ".join(f"{n:03d}" + "y" * ((1 << 20) - 3) for n in range(65))


@pytest.mark.parametrize("name", ["copilot"])
def test_an_answer_over_the_64_mib_ceiling_fails_the_turn_with_its_size_and_the_runtime_goes_on(
    name: str, tmp_path: Path
) -> None:
    assert name in RUNTIMES
    with runtime_profile(name, tmp_path) as rt:
        d = Daemon(tmp_path, rt.config_toml, env=rt.env).start()
        try:
            work = tmp_path / "work"
            work.mkdir()
            other = json.loads(d.agentctl("new", "-p", rt.provider, "--cwd", str(work), "--json").stdout)["id"]
            cid = json.loads(d.agentctl("new", "-p", rt.provider, "--cwd", str(work), "--json").stdout)["id"]
            rt.text_only(HUGE_TEXT)
            sent = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), "send", cid, "Say a lot",
                                   "--follow", "--json"], env=d.env, capture_output=True, timeout=300)
            ends = [r["data"] for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
            assert ends and ends[-1]["state"] == "failed", (ends, d.log.read_text()[-3000:])
            assert sent.returncode == 1, sent.stderr[-2000:]
            error = ends[-1]["error"]
            size = re.fullmatch(r"the runtime sent a message of ([\d,]+) bytes, over the reader's ceiling "
                                r"of ([\d,]+) bytes \(64 MiB\)", error)
            assert size, error
            # the frame on the wire: the whole answer and its event around it, past the ceiling
            assert int(size[1].replace(",", "")) > len(HUGE_TEXT) > MAX_MESSAGE_BYTES, error
            assert int(size[2].replace(",", "")) == MAX_MESSAGE_BYTES
            assert not ends[-1].get("inferred"), ends[-1]  # the CLI ended its (aborted) turn itself
            notices = [r["data"]["text"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "notice"]
            assert f"error: {error}" in notices, notices
            # what was streamed of it: its start (10 MiB, the item bound), saying how much was cut, a record a
            # client can read
            (kept,) = [r["data"]["text"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]
            head, _, note = kept.rpartition("\n")
            assert HUGE_TEXT.startswith(head) and len(head) == MAX_ITEM_TEXT_CHARS, len(head)
            assert note == f"[{len(HUGE_TEXT) - len(head)} more bytes cut: the streamed message passed agentd's ceiling " \
                           f"of {MAX_MESSAGE_BYTES:,} bytes]", note
            events = d.log_events()
            refused = [e for e in events if e.get("event") == "copilot.message_refused"]
            # the answer's one event agentd reads; the CLI's model.* telemetry holding it too is only logged
            sid = d.record(cid)["provider_conversation_id"]
            assert [(e["event_type"], e["session"]) for e in refused] == [("assistant.message", sid)], refused
            assert not [e for e in events if e.get("event") == "copilot.runtime_exited"], "the runtime was lost"
            assert len([e for e in events if e.get("event") == "copilot.runtime_started"]) == 1
            rt.text_only("Short again.")
            again = d.agentctl("send", cid, "And now?", "--follow", "--json", timeout=180)
            assert again.returncode == 0, again.stderr[-2000:]
            ends = [r["data"] for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
            assert len(ends) == 2 and ends[-1]["state"] == "completed", ends
            rt.text_only("The other one.")
            side = d.agentctl("send", other, "Hello?", "--follow", "--json", timeout=120)
            assert side.returncode == 0, side.stderr[-2000:]
            assert len([e for e in d.log_events() if e.get("event") == "copilot.runtime_started"]) == 1
        finally:
            d.stop()


@pytest.mark.parametrize("name", ["claude", "acp:claude"])  # the Copilot CLI refuses the model stream itself
def test_a_lone_surrogate_in_a_real_runtimes_answer_is_journaled_as_u_fffd_and_the_turn_completes(
    name: str, tmp_path: Path
) -> None:
    assert name in RUNTIMES
    with runtime_profile(name, tmp_path) as rt:
        d = Daemon(tmp_path, rt.config_toml, env=rt.env).start()
        try:
            work = tmp_path / "work"
            work.mkdir()
            rt.text_only("odd \ud800 text")
            cid = json.loads(d.agentctl("new", "-p", rt.provider, "--cwd", str(work), "--json").stdout)["id"]
            sent = d.agentctl("send", cid, "Say it", "--follow", "--json", timeout=180)
            ends = [r["data"] for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
            assert ends and ends[-1]["state"] == "completed", (ends, d.log.read_text()[-3000:])
            assert sent.returncode == 0, sent.stderr[-2000:]
            texts = [r["data"].get("text", "") for r in d.journal(cid)
                     if r["type"] == "item" and r["data"]["kind"] == "assistant"]
            assert any("odd \ufffd text" in t for t in texts), texts
        finally:
            d.stop()
