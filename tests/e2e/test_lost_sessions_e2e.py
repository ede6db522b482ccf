"""A real runtime killed before it saved the session: the next prompt works (agentd.lost_sessions).

The CI flake of ``acp:copilot-runtime_killed``: the Copilot CLI, SIGKILLed while its first turn
streamed, had not written ``session-state/<id>`` yet, and its next process answered the reload
"Resource not found". codex-acp, killed after it created its session file and before it wrote
to it, answers "empty session file" instead. Whether a runtime has saved the session by the time
of the kill is timing; this test makes it certain by removing what it saved (every file or
directory of its store named after the session), or for Codex by emptying those files, then
checks what a user sees: the turn ended failed, the next prompt
completes in a fresh runtime session of the same conversation, a notice says so, and the killed
prompt is not resent.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import Follower, _descendants, _new, _turn_ends
from daemon_harness import Daemon
from runtimes_e2e import Runtime, runtime_profile

pytestmark = pytest.mark.e2e


#: runtime -> its session store under the runtime's root (see runtimes_e2e)
STORES = {"copilot": "copilot-home", "acp:copilot": "copilot-home", "claude": "claude-config", "codex": "codex-home",
          "acp:codex": "codex-acp-home"}
#: runtime [+ " emptied": the store keeps the session's files, empty, as after a kill between their
#: creation and first write (codex-acp and the Codex app-server then answer "empty session file")]
CASES = ["copilot", "acp:copilot", "claude", "codex", "codex emptied", "acp:codex emptied"]


def _forget(store: Path, session: str) -> list[Path]:
    """Remove every file or directory under ``store`` whose name holds ``session``; those removed."""
    assert store.is_dir(), f"no session store at {store}"
    gone = [p for p in store.rglob(f"*{session}*")]
    for p in sorted(gone, key=lambda p: len(p.parts)):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone


def _empty(store: Path, session: str) -> list[Path]:
    """Truncate every file under ``store`` whose name holds ``session``; those emptied."""
    assert store.is_dir(), f"no session store at {store}"
    files = [p for p in store.rglob(f"*{session}*") if p.is_file()]
    for p in files:
        p.write_bytes(b"")
    return files


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def runtime(case: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    name = case.split()[0]
    root = tmp_path_factory.mktemp(case.replace(":", "-").replace(" ", "-"))
    with runtime_profile(name, root) as rt:
        yield rt


@pytest.mark.own_daemon
def test_a_runtime_killed_before_it_saved_the_session_goes_on_in_a_fresh_one(
    runtime: Runtime, daemon: Daemon, workdir: Path, case: str
) -> None:
    runtime.slow_text()
    cid = _new(daemon, runtime, workdir, "runtime_killed")
    lost = daemon.record(cid)["provider_conversation_id"]
    follower = Follower(daemon, cid, "Tell me a long story")
    follower.wait_for(lambda line: line.get("type") == "delta")
    for pid in _descendants(daemon.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert follower.finish(timeout=60) == 1, follower.stderr()
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "failed"
    # What it had saved of the session (the CI flakes: nothing yet, or an empty session file).
    store = runtime.root / STORES[runtime.name]
    if case.endswith(" emptied"):
        assert _empty(store, lost), f"no file of session {lost} in {store}"
    else:
        _forget(store, lost)

    runtime.text_only("Alive again.")
    again = Follower(daemon, cid, "Are you there?")
    assert again.finish() == 0, again.stderr()
    journal = daemon.journal(cid)
    notices = [r["data"]["text"] for r in journal if r["type"] == "item" and r["data"]["kind"] == "notice"]
    assert any(lost in n and "nothing it kept is lost" in n for n in notices), notices
    fresh = daemon.record(cid)["provider_conversation_id"]
    assert fresh and fresh != lost
    prompts = [r["data"]["text"] for r in journal if r["type"] == "prompt"]
    assert prompts == ["Tell me a long story", "Are you there?"]
    assert runtime.server is not None
    sent = [str(r) for r in runtime.server.requests]
    assert sum("Tell me a long story" in body for body in sent if "Are you there?" in body) == 0, \
        "the killed prompt reached the model again"
