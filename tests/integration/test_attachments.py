"""Attachments through the real daemon and agentctl: stored, recorded, passed on, bounded, swept.

The script provider answers "Got [{attachments}] with: {prompt}"
(tests/integration/scripts/attach.toml), so the files it was handed show in
its answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agentd import wire
from daemon_harness import Daemon

SCRIPTS = Path(__file__).parent / "scripts"
ATTACH = str(SCRIPTS / "attach.toml")
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def start(root: Path, config: str = "") -> Daemon:
    root.mkdir()
    return Daemon(root, config).start()


def new(daemon: Daemon, workdir: Path) -> str:
    return one_json(daemon.agentctl("new", "-p", "script", "-m", ATTACH, "--cwd", str(workdir), "--json"))["id"]


def attachments_dir(daemon: Daemon, conv: str) -> Path:
    return daemon.state_dir / "conversations" / conv / "attachments"


def test_run_with_attachments_stores_them_records_them_and_hands_them_to_the_provider(
    daemon: Daemon, workdir: Path
) -> None:
    notes = workdir / "notes.txt"
    notes.write_text("remember the milk\n")
    shot = workdir / "screen shot.png"
    shot.write_bytes(PNG)

    cp = daemon.agentctl("run", "-p", "script", "-m", ATTACH, "--cwd", str(workdir),
                         "--attach", str(notes), "--attach", str(shot), "what is in these?", "--json")
    assert cp.returncode == 0, cp.stderr
    lines = [json.loads(line) for line in cp.stdout.splitlines()]
    conv = lines[-1]["conversation"]

    # The prompt record carries the attachments (no path: the journal names files, the store holds them).
    prompt = next(x for x in lines if x["type"] == "prompt")
    notes_id = hashlib.sha256(notes.read_bytes()).hexdigest()[:16]
    shot_id = hashlib.sha256(PNG).hexdigest()[:16]
    assert prompt["data"]["attachments"] == [
        {"name": "notes.txt", "mime": "text/plain", "size": 18, "id": notes_id},
        {"name": "screen shot.png", "mime": "image/png", "size": len(PNG), "id": shot_id},
    ]
    # The provider got them, and recorded them on its user item.
    answer = "".join(x["data"].get("text", "") for x in lines if x["type"] == "item" and x["data"]["kind"] == "assistant")
    assert answer == "Got [notes.txt, screen shot.png] with: what is in these?"
    user_item = next(x for x in lines if x["type"] == "item" and x["data"]["kind"] == "user")
    assert [a["name"] for a in user_item["data"]["attachments"]] == ["notes.txt", "screen shot.png"]

    # Stored under the conversation, owner-only, named <sha256 prefix>-<name>, byte for byte.
    d = attachments_dir(daemon, conv)
    stored = sorted(p.name for p in d.iterdir())
    assert stored == sorted([f"{notes_id}-notes.txt", f"{shot_id}-screen shot.png"])
    for p in d.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600
    assert (d / f"{shot_id}-screen shot.png").read_bytes() == PNG
    assert d.stat().st_mode & 0o777 == 0o700


def test_send_attach_reaches_a_running_conversation_and_is_repeatable(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    a, b = workdir / "a.md", workdir / "b.json"
    a.write_text("# A\n")
    b.write_text('{"b": 1}\n')
    cp = daemon.agentctl("send", conv, "two files", "--attach", str(a), "--attach", str(b), "--follow")
    assert cp.returncode == 0, cp.stderr
    assert "Got [a.md, b.json] with: two files" in cp.stdout
    mimes = [x["data"]["attachments"] for x in daemon.journal(conv) if x["type"] == "prompt"][0]
    assert [(m["name"], m["mime"]) for m in mimes] == [("a.md", "text/markdown"), ("b.json", "application/json")]


def test_files_past_the_limits_are_refused_with_a_clear_error_and_nothing_is_sent(tmp_path: Path, workdir: Path) -> None:
    d = start(tmp_path / "d", "[attachments]\nmax_bytes = 1024\nmax_files = 2\n")
    try:
        conv = new(d, workdir)
        big = workdir / "big.txt"
        big.write_bytes(b"x" * 2000)
        cp = d.agentctl("send", conv, "too big", "--attach", str(big))
        assert cp.returncode == 1
        assert "limit: attachment 'big.txt' is 2.0 KiB, over the 1.0 KiB limit ([attachments] max_bytes)" in cp.stderr

        binary = workdir / "tool.bin"
        binary.write_bytes(bytes(range(256)))
        cp = d.agentctl("send", conv, "binary", "--attach", str(binary))
        assert cp.returncode == 8
        assert "application/octet-stream, which is not allowed" in cp.stderr

        fake = workdir / "fake.png"
        fake.write_text("not a picture")
        cp = d.agentctl("send", conv, "fake", "--attach", str(fake))
        assert cp.returncode == 8 and "is named as image/png but its content is not" in cp.stderr

        small = [workdir / f"s{i}.txt" for i in range(3)]
        for p in small:
            p.write_text("s")
        cp = d.agentctl("send", conv, "many", *[x for p in small for x in ("--attach", str(p))])
        assert cp.returncode == 1 and "at most 2 ([attachments] max_files)" in cp.stderr

        assert not [r for r in d.journal(conv) if r["type"] == "prompt"], "no refused prompt was journaled"
        assert not attachments_dir(d, conv).exists() or not list(attachments_dir(d, conv).iterdir())
    finally:
        d.stop()


def _agentctl_bounded(d: Daemon, *args: str, timeout: float = 15.0) -> tuple[subprocess.CompletedProcess[str], float]:
    """agentctl with 1 GiB of address space at most (a regression fails, not the machine), timed."""
    import resource
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), *args], env=d.env,
                        capture_output=True, text=True, timeout=timeout, cwd=d.root, preexec_fn=cap)
    return cp, time.monotonic() - t0


def test_attach_takes_regular_files_only_and_never_reads_past_the_limit(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    fifo = workdir / "pipe"
    os.mkfifo(fifo)
    huge = workdir / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB to read, none on disk
    link = workdir / "zero-link"
    link.symlink_to("/dev/zero")
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO"), (str(link), "a character device")):
        cp, took = _agentctl_bounded(daemon, "send", conv, "hi", "--attach", path)
        assert cp.returncode == 2, cp.stderr
        assert f"cannot attach {path}: not a regular file ({kind})" in cp.stderr
        assert took < 10, f"--attach {path} took {took:.1f}s to fail"
    cp, took = _agentctl_bounded(daemon, "send", conv, "hi", "--attach", str(huge))
    assert cp.returncode == 1, cp.stderr
    assert "limit: attachment 'huge.bin' is 64.0 MiB, over the 10.0 MiB limit ([attachments] max_bytes)" in cp.stderr
    assert took < 10
    assert not [r for r in daemon.journal(conv) if r["type"] == "prompt"], "a refused prompt was sent"


def test_a_request_over_the_frame_limit_is_refused_by_agentctl_before_sending(tmp_path: Path, workdir: Path) -> None:
    d = start(tmp_path / "d", "[server]\nmax_frame_bytes = 4096\n")
    try:
        conv = new(d, workdir)
        f = workdir / "four-k.txt"
        f.write_text("y" * 4000)
        cp = d.agentctl("send", conv, "hi", "--attach", str(f))
        assert cp.returncode == 1
        assert "over agentd's limit of 4096 (server.max_frame_bytes)" in cp.stderr
        # The daemon is fine, and so is the conversation.
        assert d.agentctl("send", conv, "hi again", "--follow").returncode == 0
    finally:
        d.stop()


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/passwd", "sub/dir.txt", "..", "back\\slash.txt", ""])
def test_names_that_climb_or_name_a_path_are_refused_and_nothing_is_written(
    daemon: Daemon, workdir: Path, name: str
) -> None:
    conv = new(daemon, workdir)
    with daemon.client() as client:
        upload = wire.Upload(name=name, data=base64.b64encode(b"payload").decode())
        with pytest.raises(Exception) as info:
            client.request(wire.Send, conversation=conv, text="sneaky", attachments=[upload])
    assert getattr(info.value, "code", "") == "invalid", info.value
    assert not (daemon.state_dir / "conversations" / "escape.txt").exists()
    assert not (daemon.state_dir / "conversations" / conv / "escape.txt").exists()
    assert not attachments_dir(daemon, conv).exists() or not list(attachments_dir(daemon, conv).iterdir())


def test_odd_names_are_reduced_to_one_safe_component(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    with daemon.client() as client:
        upload = wire.Upload(name=".hidden\x07name.txt", data=base64.b64encode(b"ok").decode())
        client.request(wire.Send, conversation=conv, text="odd", attachments=[upload])
    [stored] = list(attachments_dir(daemon, conv).iterdir())
    assert stored.name.endswith("-hidden_name.txt")


def test_old_uploads_are_swept_at_start_up(tmp_path: Path, workdir: Path) -> None:
    d = start(tmp_path / "d", "[attachments]\nretention_days = 7\n")
    try:
        conv = new(d, workdir)
        old, fresh = workdir / "old.txt", workdir / "fresh.txt"
        old.write_text("old")
        fresh.write_text("fresh")
        assert d.agentctl("send", conv, "one", "--attach", str(old), "--follow").returncode == 0
        assert d.agentctl("send", conv, "two", "--attach", str(fresh), "--follow").returncode == 0
    finally:
        d.stop()
    stored = {p.name.split("-", 1)[1]: p for p in attachments_dir(d, conv).iterdir()}
    ten_days_ago = time.time() - 10 * 86400
    os.utime(stored["old.txt"], (ten_days_ago, ten_days_ago))
    d.start()
    try:
        deadline = time.monotonic() + 10
        while stored["old.txt"].exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stored["old.txt"].exists()
        assert stored["fresh.txt"].exists()
        # The journal still says what was sent.
        names = [a["name"] for r in d.journal(conv) if r["type"] == "prompt" for a in r["data"].get("attachments", [])]
        assert names == ["old.txt", "fresh.txt"]
    finally:
        d.stop()


def test_providers_say_whether_they_take_attachments(daemon: Daemon) -> None:
    infos = {p["name"]: p for p in one_json(daemon.agentctl("providers", "--json"))["providers"]}
    assert infos["script"]["capabilities"]["attachments"] is True
    assert infos["copilot"]["capabilities"]["attachments"] is True
    assert infos["claude"]["capabilities"]["attachments"] is True
