"""Build state directories the way agentd leaves them, fast: records and journals written directly.

The files have exactly agentd's format (``wire.ConversationRecord`` in
``record.json``, one ``wire.Record`` per line in ``events.jsonl``), so the
daemon cannot tell them from its own; writing them directly takes seconds
where creating them through the socket would take minutes of fsyncs.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from agentd import wire

_encode = msgspec.json.Encoder().encode
TS = "2026-01-01T00:00:00.000Z"


def _record(cid: str, workdir: Path, last_seq: int) -> bytes:
    return _encode(
        wire.ConversationRecord(
            id=cid, provider="script", workdir=str(workdir), created_at=TS, updated_at=TS, title=f"bench {cid}", turn_after=last_seq
        )
    )


def write_conversations(state_dir: Path, count: int, events: int = 4) -> list[str]:
    """``count`` idle script conversations of ``events`` records each under ``state_dir``; returns their ids."""
    root = state_dir / "conversations"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = state_dir.parent / "work"
    work.mkdir(exist_ok=True)
    created = _encode(wire.Record(type="conversation", ts=TS, seq=1, data=msgspec.Raw(b'{"provider":"script","workdir":"%s"}' % str(work).encode())))
    lines = [created] + [
        _encode(wire.Record(type="prompt", ts=TS, seq=i, run="r0123456789ab", data=msgspec.Raw(b'{"text":"hello"}')))
        for i in range(2, events + 1)
    ]
    body = b"\n".join(lines) + b"\n"
    ids = []
    for i in range(count):
        cid = f"c{i:012x}"
        d = root / cid
        d.mkdir(mode=0o700)
        _write(d / "events.jsonl", body)
        _write(d / "record.json", _record(cid, work, events))
        ids.append(cid)
    return ids


def write_long_journal(state_dir: Path, events: int, size: int = 200) -> str:
    """One conversation whose journal holds ``events`` records of ~``size`` bytes; returns its id."""
    cid = "c0000000long0"
    d, work = _conversation_dir(state_dir, cid)
    pad = b"x" * max(0, size - 130)
    item = b'{"id":"i0123abcd","kind":"assistant","text":"' + pad + b'"}'
    with open(d / "events.jsonl", "wb", buffering=1 << 22) as f:
        os.fchmod(f.fileno(), 0o600)
        enc, Rec, raw = _encode, wire.Record, msgspec.Raw(item)
        step = 100_000
        for lo in range(1, events + 1, step):
            hi = min(events, lo + step - 1)
            f.write(b"".join(enc(Rec(type="item", ts=TS, seq=s, run="r0123456789ab", data=raw)) + b"\n" for s in range(lo, hi + 1)))
    _write(d / "record.json", _record(cid, work, events))
    return cid


def _conversation_dir(state_dir: Path, cid: str) -> tuple[Path, Path]:
    """A new conversation directory under ``state_dir`` and the working directory beside it."""
    root = state_dir / "conversations"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = state_dir.parent / "work"
    work.mkdir(exist_ok=True)
    d = root / cid
    d.mkdir(mode=0o700)
    return d, work


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_turns_journal(state_dir: Path, events: int) -> str:
    """One conversation of whole turns, ``events`` records in all; returns its id.

    Each turn is a prompt, an assistant message, a tool call announced then completed, a
    closing message, usage and the turn's end: the record mix ``history`` pages through.
    Tool call ids repeat in every turn, as runtimes reuse theirs.
    """
    cid = "c000000turns0"
    d, work = _conversation_dir(state_dir, cid)
    turn = [
        ("prompt", b'{"text":"run the tests and fix what fails"}'),
        ("item", b'{"id":"m1","kind":"assistant","text":"I will run the test suite first."}'),
        ("item", b'{"id":"call_1","kind":"tool","tool":{"name":"bash","status":"running","input":"pytest -q"}}'),
        ("item", b'{"id":"call_1","kind":"tool","tool":{"name":"bash","status":"completed","input":"pytest -q",'
                 b'"output":"' + b"." * 120 + b' 120 passed"}}'),
        ("item", b'{"id":"m2","kind":"assistant","text":"All 120 tests pass; nothing to fix."}'),
        ("usage", b'{"input_tokens":1200,"output_tokens":80}'),
        ("turn", b'{"state":"completed"}'),
    ]
    enc, Rec = _encode, wire.Record
    with open(d / "events.jsonl", "wb", buffering=1 << 22) as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(enc(Rec(type="conversation", ts=TS, seq=1, data=msgspec.Raw(b'{"provider":"script","workdir":"%s"}' % str(work).encode()))) + b"\n")
        seq, n = 1, 0
        while seq < events:
            run = f"r{n:012x}"
            for type_, data in turn:
                if seq >= events:
                    break
                seq += 1
                f.write(enc(Rec(type=type_, ts=TS, seq=seq, run=run, data=msgspec.Raw(data))) + b"\n")
            n += 1
    _write(d / "record.json", _record(cid, work, events))
    return cid
