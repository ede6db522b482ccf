"""Crash harness: SIGKILL the real daemon at random moments, restart it, prove nothing was lost.

Run it from the repository root::

    .venv/bin/python -m tests.reliability.crash --kills 1000          # the documented run (~30 min on 2 cores)
    .venv/bin/python -m tests.reliability.crash --kills 50 --seed 7    # what CI runs (test_crash.py)

It starts ``agentd run`` (fsync ``always``, lease ttl 0.3 s so renewals are
frequent) on a temp state dir, creates a few conversations on the ``script``
provider (``scripts/crash.toml``: streamed text, tools, a permission, usage,
a title), and then, once per kill, drives turns through the real socket and
kills the daemon with SIGKILL at a moment picked by one of four modes:

* ``append``: a random time in the middle of turns (appends, fsyncs, record writes);
* ``answer``: 0 to 15 ms after a permission answer is sent, before or while it is delivered;
* ``lease``: the instant a lease renewal's temporary file appears (mid atomic write);
* ``startup``: right after one of the kills above, the restarted daemon is killed again
  0.2 to 0.8 s after it starts: during recovery, or just after it.

After each kill it checks, before and after the restart:

* every journal's complete lines are records with seq 1, 2, 3 ... (no gap, no
  duplicate), and the restart neither rewrote nor dropped one of them;
* every durable record a subscriber received (fsync ``always``: acknowledged
  by the append) is on disk at its seq, byte for byte;
* every prompt the daemon acknowledged is journaled, and every answer it
  acknowledged is journaled;
* ``received.jsonl`` (what the script provider was handed) holds each prompt
  at most once, and only prompts the journal has: nothing was resent;
* every run has exactly one terminal ``turn`` record, a run cut by the kill
  ends ``run_interrupted``, its pending interactions are no longer pending,
  the record is idle again;
* the conversation takes a new prompt (the next drive's first send succeeds).

Exit status 0 when every check held; 1 (and the state dir kept) at the first
failure. ``--json FILE`` writes the figures (RELIABILITY.md quotes them).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # tests/: daemon_harness

import msgspec  # noqa: E402

from agentd import wire  # noqa: E402
from daemon_harness import Daemon  # noqa: E402

SCRIPT = HERE / "scripts" / "crash.toml"

#: copilot and claude are off: importing their SDKs costs seconds per restart.
CONFIG = """\
[journal]
fsync = "always"
[leases]
ttl_s = 0.3
[providers.copilot]
enabled = false
[providers.claude]
enabled = false
"""

MODES = ("append", "answer", "lease", "startup")
WEIGHTS = (45, 25, 15, 15)


class CheckFailed(AssertionError):
    pass


# --------------------------------------------------------------------------- a pipelining client


class Conn:
    """A client that sends requests without waiting; a reader thread files replies and pushed frames.

    After the daemon is killed the reader sees EOF; ``replies`` then holds
    exactly what the daemon answered before it died.
    """

    def __init__(self, path: Path, on_push: Callable[[Any], None] | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        hello = self._read()
        assert isinstance(hello, wire.HelloFrame), hello
        self.sock.sendall(wire.encode(wire.Hello(id=0, protocol=wire.PROTOCOL_VERSION, client="crash")))
        assert isinstance(self._read(), wire.ResultFrame)
        self.on_push = on_push
        self.replies: dict[int, Any] = {}
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()
        self.eof = False
        self.next_id = 1
        self.thread = threading.Thread(target=self._reader, daemon=True)
        self.thread.start()

    def _read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise EOFError
        return wire.decode_server_frame(line.rstrip(b"\n"))

    def _reader(self) -> None:
        try:
            while True:
                frame = self._read()
                if isinstance(frame, (wire.ResultFrame, wire.ErrorFrame)):
                    with self.cond:
                        self.replies[frame.id] = frame
                        self.cond.notify_all()
                elif self.on_push is not None:
                    self.on_push(frame)
        except (EOFError, OSError, ValueError):
            pass
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()

    def send(self, op: type, **fields: Any) -> int:
        """Send one request; returns its id. Raises OSError when the daemon is gone."""
        with self.send_lock:
            rid = self.next_id
            self.next_id += 1
            self.sock.sendall(wire.encode(op(id=rid, **fields)))
        return rid

    def wait(self, rid: int, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while rid not in self.replies and not self.eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to request {rid}")
                self.cond.wait(left)
            return self.replies.get(rid)

    def request(self, op: type, **fields: Any) -> Any:
        frame = self.wait(self.send(op, **fields))
        if frame is None:
            raise EOFError("agentd closed the connection")
        if isinstance(frame, wire.ErrorFrame):
            raise wire.error_from_body(frame.error)
        return msgspec.json.decode(frame.result)

    def join(self, timeout: float = 10.0) -> None:
        self.thread.join(timeout)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader, which holds the file's lock
        except OSError:
            pass
        self.thread.join(5)
        for closer in (self.file.close, self.sock.close):
            try:
                closer()
            except OSError:
                pass


# --------------------------------------------------------------------------- on-disk state


@dataclass
class JournalState:
    lines: list[bytes]
    torn: bytes
    records: list[dict[str, Any]]


def read_journal(path: Path) -> JournalState:
    """The journal's complete lines (checked: records, seq 1..n) and any torn tail."""
    data = path.read_bytes() if path.exists() else b""
    *lines, torn = data.split(b"\n")
    records = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise CheckFailed(f"{path}: line {n} is not JSON ({exc}): {line[:200]!r}") from None
        if rec.get("seq") != n:
            raise CheckFailed(f"{path}: line {n} has seq {rec.get('seq')} (gap or duplicate)")
        records.append(rec)
    return JournalState(lines, torn, records)


def terminal_turns(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    ends: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        if r["type"] == "turn" and r["data"].get("state") != "working":
            ends[r.get("run", "")].append(r)
    return ends


def runs_in_flight(records: list[dict[str, Any]]) -> set[str]:
    """Runs that started (a prompt or a turn record) and have no terminal turn."""
    started = {r["run"] for r in records if r.get("run") and r["type"] in ("prompt", "turn")}
    return started - set(terminal_turns(records))


# --------------------------------------------------------------------------- the harness


@dataclass
class Conv:
    id: str
    pcid: str = ""
    run: str | None = None
    send_rid: int | None = None
    queued_rid: int | None = None
    #: the queued prompt's run: it starts when ``run`` ends
    next_run: str | None = None
    sends_this_drive: int = 0
    ended: set[str] = field(default_factory=set)


@dataclass
class Figures:
    kills: int = 0
    modes: collections.Counter = field(default_factory=collections.Counter)
    lease_writes_hit: int = 0
    events_checked: int = 0
    journal_lines_checked: int = 0
    prompts_acked: int = 0
    answers_acked: int = 0
    #: answers in flight when the daemon was killed, and how many of those were journaled anyway
    answers_cut: int = 0
    answers_cut_journaled: int = 0
    runs_interrupted: int = 0
    runs_completed: int = 0
    torn_tails: int = 0
    restarts: int = 0
    seconds: float = 0.0


class CrashHarness:
    def __init__(self, root: Path, *, seed: int, conversations: int = 3, rotate: int = 40, log: Callable[[str], None] = print) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_convs = conversations
        self.rotate = rotate
        self.log = log
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.daemon = Daemon(root, CONFIG, env={"AGENTD_LOG_LEVEL": "info"})
        self.convs: list[Conv] = []
        self.retired: list[str] = []
        self.figures = Figures()
        self.lock = threading.Lock()
        # Since the last successful verify: what the daemon acknowledged.
        self.received: dict[str, dict[int, bytes]] = collections.defaultdict(dict)
        self.acked_sends: list[tuple[str, str, str]] = []
        self.acked_answers: list[tuple[str, str]] = []
        #: answers sent whose reply the kill cut off
        self.cut_answers: list[tuple[str, str]] = []
        self.pending: list[tuple[str, str, str]] = []  # (cid, run, interaction id)
        self.prompt_no = 0
        self.killed = threading.Event()
        #: prompt text -> conversation, for checking received.jsonl
        self.text_conv: dict[str, str] = {}
        self._reported = 0
        self.verified_len: dict[str, int] = {}
        #: the driver's last actions, printed with a failure
        self.trace: collections.deque[str] = collections.deque(maxlen=60)

    # ------------------------------------------------------------------ process

    @property
    def conv_dir(self) -> Path:
        return self.daemon.state_dir / "conversations"

    def spawn(self) -> None:
        logf = open(self.daemon.log, "ab")
        self.daemon.proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "run"], env=self.daemon.env, stdout=logf, stderr=subprocess.STDOUT,
            cwd=self.root,
        )
        logf.close()

    def kill(self) -> None:
        proc = self.daemon.proc
        assert proc is not None
        if not self.killed.is_set():
            self.killed.set()
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def start(self) -> None:
        self.daemon.start(timeout=30)
        self.figures.restarts += 1

    # ------------------------------------------------------------------ subscriber side

    def _on_push(self, sub_to_conv: dict[int, str], frame: Any, conn_ref: list[Conn]) -> None:
        if isinstance(frame, wire.EventFrame):
            raw = bytes(frame.record)
            rec = wire.decode_record(raw)
            cid = frame.conversation
            with self.lock:
                if rec.seq:
                    prev = self.received[cid].get(rec.seq)
                    if prev is not None and prev != raw:
                        raise CheckFailed(f"{cid}: seq {rec.seq} delivered twice with different content")
                    self.received[cid][rec.seq] = raw
                if rec.type == "interaction":
                    inter = msgspec.json.decode(rec.data)
                    if inter.get("state", "pending") == "pending" and inter.get("kind") == "permission":
                        self.pending.append((cid, rec.run, inter["id"]))
                elif rec.type == "turn" and msgspec.json.decode(rec.data).get("state") != "working":
                    for conv in self.convs:
                        if conv.id == cid:
                            conv.ended.add(rec.run)
                            self.trace.append(f"end {cid} {rec.run} (running {conv.run}, next {conv.next_run})")
                            if conv.run == rec.run:
                                conv.run, conv.next_run = conv.next_run, None
                                if conv.run in conv.ended:
                                    conv.run = None
        elif isinstance(frame, wire.LaggedFrame):
            cid = sub_to_conv.get(frame.sub)
            if cid is not None and not self.killed.is_set():
                try:
                    rid = conn_ref[0].send(wire.Subscribe, conversation=cid, after=frame.resume_after)
                    sub_to_conv[rid] = cid
                except OSError:
                    pass

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        self.spawn_and_wait()
        self.add_conversations(self.n_convs)

    def spawn_and_wait(self) -> None:
        self.killed.clear()
        self.start()

    def add_conversations(self, n: int) -> None:
        conn = Conn(self.daemon.socket)
        try:
            for _ in range(n):
                rec = conn.request(wire.New, provider="script", workdir=str(self.workdir), model=str(SCRIPT))
                self.convs.append(Conv(id=rec["id"], pcid=rec.get("provider_conversation_id", "")))
        finally:
            conn.close()

    def maybe_rotate(self, cycle: int) -> None:
        """Every ``rotate`` kills, retire the conversations (checked once more at the end) and start new ones."""
        if self.rotate and cycle and cycle % self.rotate == 0:
            self.retired.extend(c.id for c in self.convs)
            self.convs = []
            self.add_conversations(self.n_convs)

    # ------------------------------------------------------------------ one drive, ended by a kill

    def drive(self, mode: str) -> None:
        """Run turns on every conversation until the kill that ``mode`` picks."""
        self.killed.clear()
        for conv in self.convs:
            conv.run, conv.send_rid, conv.queued_rid, conv.next_run, conv.sends_this_drive = None, None, None, None, 0
        sub_to_conv: dict[int, str] = {}
        ref: list[Conn] = []
        sub = Conn(self.daemon.socket, on_push=lambda f: self._on_push(sub_to_conv, f, ref))
        ref.append(sub)
        drv = Conn(self.daemon.socket)
        answers: dict[int, tuple[str, str]] = {}
        sends: dict[int, tuple[Conv, str]] = {}
        queued: dict[int, tuple[Conv, str]] = {}
        with self.lock:
            self.pending.clear()
        try:
            for conv in self.convs:
                last = len(read_journal(self.conv_dir / conv.id / "events.jsonl").lines)
                rid = sub.send(wire.Subscribe, conversation=conv.id, after=max(0, last - 10), snapshot=False)
                sub_to_conv[rid] = conv.id
            t0 = time.monotonic()
            kill_at = t0 + (self.rng.uniform(0.02, 1.2) if mode == "append" else 3.0)
            if mode == "lease":
                threading.Thread(target=self._kill_on_lease_write, args=(t0 + 1.5,), daemon=True).start()
            while not self.killed.is_set():
                for conv in self.convs:
                    self._collect_send(drv, conv, sends)
                    frame = drv.replies.get(conv.queued_rid) if conv.queued_rid else None
                    if isinstance(frame, wire.ResultFrame):
                        conv.queued_rid = None
                        run = msgspec.json.decode(frame.result)["run"]
                        with self.lock:
                            if conv.run is not None:
                                conv.next_run = run
                            elif run not in conv.ended:
                                conv.run = run  # the turn ahead of it ended already
                            self.trace.append(f"queued {conv.id} {run} -> running {conv.run} next {conv.next_run}")
                    if conv.run is None and conv.send_rid is None and conv.queued_rid is None:
                        self.prompt_no += 1
                        text = f"p{self.prompt_no}-{self.seed}"
                        try:
                            conv.send_rid = drv.send(wire.Send, conversation=conv.id, text=text)
                        except OSError:
                            break
                        sends[conv.send_rid] = (conv, text)
                        self.trace.append(f"send {conv.id} {text}")
                        self.text_conv[text] = conv.id
                        conv.sends_this_drive += 1
                    elif conv.run is not None and conv.next_run is None and conv.queued_rid is None \
                            and self.rng.random() < 0.01:
                        # Now and then a prompt queued behind the running turn.
                        self.prompt_no += 1
                        text = f"p{self.prompt_no}-{self.seed}"
                        try:
                            conv.queued_rid = drv.send(wire.Send, conversation=conv.id, text=text, if_busy="queue")
                        except OSError:
                            break
                        queued[conv.queued_rid] = (conv, text)
                        self.trace.append(f"queue {conv.id} {text}")
                        self.text_conv[text] = conv.id
                with self.lock:
                    todo = [p for p in self.pending if any(c.id == p[0] and c.run == p[1] for c in self.convs)]
                    self.pending = [p for p in self.pending if p not in todo]
                for cid, _run, iid in todo:
                    decision = "allow_once" if self.rng.random() < 0.8 else "reject"
                    try:
                        rid = drv.send(wire.AnswerInteraction, conversation=cid, interaction=iid,
                                       answer={"decision": decision})
                    except OSError:
                        break
                    answers[rid] = (cid, iid)
                    if mode == "answer":
                        time.sleep(self.rng.uniform(0.0, 0.015))
                        self.kill()
                        break
                if time.monotonic() >= kill_at:
                    self.kill()
                    break
                time.sleep(0.002)
            self.kill()
        finally:
            sub.join()
            drv.join()
            sub.close()
            drv.close()
        # What the daemon acknowledged before it died.
        for rid, (conv, text) in sends.items():
            frame = drv.replies.get(rid)
            if isinstance(frame, wire.ResultFrame):
                run = msgspec.json.decode(frame.result)["run"]
                self.acked_sends.append((conv.id, run, text))
            elif isinstance(frame, wire.ErrorFrame):
                raise CheckFailed(f"{conv.id} did not take prompt {text!r}: {frame.error.code}: {frame.error.message}")
        for rid, (conv, text) in queued.items():
            frame = drv.replies.get(rid)
            if isinstance(frame, wire.ResultFrame):
                self.acked_sends.append((conv.id, msgspec.json.decode(frame.result)["run"], text))
            elif isinstance(frame, wire.ErrorFrame):
                raise CheckFailed(f"{conv.id} did not queue prompt {text!r}: {frame.error.code}: {frame.error.message}")
        for rid, (cid, iid) in answers.items():
            frame = drv.replies.get(rid)
            if isinstance(frame, wire.ResultFrame):
                self.acked_answers.append((cid, iid))
            elif frame is None:
                self.cut_answers.append((cid, iid))
            elif isinstance(frame, wire.ErrorFrame) and frame.error.code != "gone":
                # gone: the turn ended (or was cut) between the question and the answer.
                raise CheckFailed(f"answer to {iid} in {cid} refused: {frame.error.code}: {frame.error.message}")

    def _collect_send(self, drv: Conn, conv: Conv, sends: dict[int, tuple[Conv, str]]) -> None:
        if conv.send_rid is None:
            return
        frame = drv.replies.get(conv.send_rid)
        if frame is None:
            return
        conv.send_rid = None
        if isinstance(frame, wire.ResultFrame):
            run = msgspec.json.decode(frame.result)["run"]
            with self.lock:
                conv.run = None if run in conv.ended else run
                self.trace.append(f"sent {conv.id} {run} -> running {conv.run}")
        else:
            _, text = sends[frame.id]
            raise CheckFailed(f"{conv.id} did not take prompt {text!r}: {frame.error.code}: {frame.error.message}")

    def _kill_on_lease_write(self, deadline: float) -> None:
        """Kill the instant a lease renewal's temporary file exists (mid atomic write)."""
        dirs = [self.conv_dir / c.id for c in self.convs]
        while time.monotonic() < deadline and not self.killed.is_set():
            for d in dirs:
                try:
                    names = os.listdir(d)
                except FileNotFoundError:
                    continue
                if any(n.startswith(".lease.json.") for n in names):
                    self.figures.lease_writes_hit += 1
                    self.kill()
                    return
        self.kill()

    # ------------------------------------------------------------------ checks

    def snapshot(self) -> dict[str, JournalState]:
        """The dead daemon's journals; each must already be valid (a torn last line is allowed)."""
        snap = {}
        for cid in [c.id for c in self.convs]:
            state = read_journal(self.conv_dir / cid / "events.jsonl")
            if state.torn:
                self.figures.torn_tails += 1
            for name in ("record.json", "lease.json"):
                path = self.conv_dir / cid / name
                if path.exists():
                    try:
                        json.loads(path.read_bytes())
                    except ValueError as exc:
                        raise CheckFailed(f"{path} is not valid JSON after the kill: {exc}") from None
            snap[cid] = state
        return snap

    def verify(self, before: dict[str, JournalState], first: dict[str, JournalState]) -> None:
        """After a restart: see the module docstring for the list.

        ``before`` is the journals as the last killed daemon left them, ``first``
        as the drive's kill left them (runs cut then must end ``run_interrupted``).
        """
        all_prompts: dict[str, str] = {}
        for cid, pre in before.items():
            path = self.conv_dir / cid / "events.jsonl"
            post = read_journal(path)
            self.figures.journal_lines_checked += len(post.lines)
            if post.lines[: len(pre.lines)] != pre.lines:
                raise CheckFailed(f"{cid}: the restart rewrote or dropped journal lines")
            with self.lock:
                received = dict(self.received.get(cid, {}))
            for seq, raw in received.items():
                if seq > len(post.lines) or post.lines[seq - 1] != raw:
                    raise CheckFailed(f"{cid}: record seq {seq} was delivered to a subscriber but is not on disk: {raw[:200]!r}")
            self.figures.events_checked += len(received)
            ends = terminal_turns(post.records)
            for run, recs in ends.items():
                if run and len(recs) > 1:
                    raise CheckFailed(f"{cid}: run {run} has {len(recs)} terminal turn records: {recs}")
            prompted = {r["run"] for r in post.records if r["type"] == "prompt"}
            for run in prompted:
                if run not in ends:
                    raise CheckFailed(f"{cid}: run {run} was prompted but never ended (no terminal turn after recovery)")
            for run, recs in ends.items():
                if run and run not in prompted and recs[0]["data"].get("reason") != "run_interrupted":
                    raise CheckFailed(f"{cid}: run {run} ended without a prompt: {recs[0]}")
            for run in runs_in_flight(first[cid].records):
                end = ends.get(run)
                if not end or end[0]["data"].get("reason") != "run_interrupted":
                    raise CheckFailed(f"{cid}: run {run} was cut by the kill but does not say run_interrupted: {end}")
                self.figures.runs_interrupted += 1
            new_ends = terminal_turns(post.records[self.verified_len.get(cid, 0):])
            self.verified_len[cid] = len(post.records)
            self.figures.runs_completed += sum(
                1 for recs in new_ends.values() for r in recs if r["data"].get("reason") != "run_interrupted")
            last_state: dict[str, str] = {}
            for r in post.records:
                if r["type"] == "interaction":
                    last_state[r["data"]["id"]] = r["data"].get("state", "pending")
            stuck = [i for i, s in last_state.items() if s == "pending"]
            if stuck:
                raise CheckFailed(f"{cid}: interactions still pending after recovery: {stuck}")
            record = json.loads((self.conv_dir / cid / "record.json").read_bytes())
            if record.get("active_run") or record.get("state", "idle") != "idle":
                raise CheckFailed(f"{cid}: record not idle after recovery: {record}")
            for r in post.records:
                if r["type"] == "prompt":
                    all_prompts[r["data"]["text"]] = cid
            answered = {r["data"]["interaction_id"] for r in post.records if r["type"] == "answer"}
            for acid, iid in self.acked_answers:
                if acid == cid and iid not in answered:
                    raise CheckFailed(f"{cid}: answer to {iid} was acknowledged but is not journaled")
            for acid, iid in self.cut_answers:
                if acid == cid:
                    self.figures.answers_cut += 1
                    self.figures.answers_cut_journaled += iid in answered
            runs = {(r["run"], r["data"]["text"]) for r in post.records if r["type"] == "prompt"}
            for scid, run, text in self.acked_sends:
                if scid == cid and (run, text) not in runs:
                    raise CheckFailed(f"{cid}: prompt {text!r} (run {run}) was acknowledged but is not journaled")
        # received.jsonl: what the provider was handed, each at most once, each journaled first.
        received_path = self.daemon.state_dir / "providers" / "script" / "received.jsonl"
        texts = [json.loads(line)["text"] for line in received_path.read_bytes().splitlines() if line.strip()] \
            if received_path.exists() else []
        dup = [t for t, n in collections.Counter(texts).items() if n > 1]
        if dup:
            raise CheckFailed(f"prompts handed to the provider more than once: {dup[:5]}")
        active = {c.id for c in self.convs}
        for t in texts:
            cid = self.text_conv.get(t)
            if cid is None:
                raise CheckFailed(f"the provider got prompt {t!r}, which nobody sent")
            if cid in active and all_prompts.get(t) != cid:
                raise CheckFailed(f"the provider got prompt {t!r}, which the journal of {cid} does not hold")
        self.figures.prompts_acked += len(self.acked_sends)
        self.figures.answers_acked += len(self.acked_answers)
        with self.lock:
            self.received.clear()
        self.acked_sends.clear()
        self.acked_answers.clear()
        self.cut_answers.clear()

    # ------------------------------------------------------------------ main loop

    def run(self, kills: int, progress_every: int = 10) -> Figures:
        t0 = time.monotonic()
        self.setup()
        cycle = 0
        while cycle < kills:
            mode = self.rng.choices(MODES[:3], WEIGHTS[:3])[0]
            self.maybe_rotate(cycle)
            self.drive(mode)
            cycle += 1
            self.figures.kills += 1
            self.figures.modes[mode] += 1
            first = before = self.snapshot()
            # Sometimes kill the next daemon too while it starts: during recovery, or just after.
            while cycle < kills and self.rng.random() < WEIGHTS[3] / 100 * 2:
                self.killed.clear()
                self.spawn()
                time.sleep(self.rng.uniform(0.2, 0.8))
                self.kill()
                cycle += 1
                self.figures.kills += 1
                self.figures.modes["startup"] += 1
                after = self.snapshot()
                for cid, state in after.items():
                    if state.lines[: len(before[cid].lines)] != before[cid].lines:
                        raise CheckFailed(f"{cid}: a restart rewrote or dropped journal lines")
                before = after
            self.spawn_and_wait()
            self.verify(before, first)
            if progress_every and self.figures.kills // progress_every != self._reported:
                self._reported = self.figures.kills // progress_every
                f = self.figures
                self.log(f"[crash] {f.kills}/{kills} kills, {f.events_checked} events checked, "
                         f"{f.runs_interrupted} runs interrupted, {time.monotonic() - t0:.0f}s")
        # Finally a clean stop, and every journal ever written checked once more.
        self.daemon.stop()
        for cid in [*self.retired, *(c.id for c in self.convs)]:
            self.figures.journal_lines_checked += len(read_journal(self.conv_dir / cid / "events.jsonl").lines)
        self.figures.seconds = round(time.monotonic() - t0, 1)
        return self.figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.crash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="how many SIGKILLs (default 1000)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--conversations", type=int, default=3, help="conversations driven at once (default 3)")
    parser.add_argument("--rotate", type=int, default=40, help="new conversations every N kills (default 40)")
    parser.add_argument("--dir", type=Path, default=None, help="work here instead of a temp dir (kept)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="agentd-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"[crash] seed {seed}, {args.kills} kills, state in {root}", flush=True)
    harness = CrashHarness(root, seed=seed, conversations=args.conversations, rotate=args.rotate,
                           log=lambda s: print(s, flush=True))
    try:
        figures = harness.run(args.kills)
    except CheckFailed as exc:
        print("\n".join(harness.trace), file=sys.stderr)
        print(f"[crash] FAILED after {harness.figures.kills} kills (seed {seed}): {exc}\n"
              f"[crash] state kept in {root}; daemon log {harness.daemon.log}", file=sys.stderr)
        if harness.daemon.proc is not None and harness.daemon.proc.poll() is None:
            harness.daemon.proc.kill()
        return 1
    out = {"seed": seed, **figures.__dict__, "modes": dict(figures.modes)}
    print("[crash] OK " + json.dumps(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
