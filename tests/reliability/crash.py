"""Crash harness: SIGKILL the real daemon at random moments, restart it, prove nothing was lost.

Run it from the repository root::

    .venv/bin/python -m tests.reliability.crash --kills 1000          # the documented run (~30 min on 2 cores)
    .venv/bin/python -m tests.reliability.crash --kills 50 --seed 7    # what CI runs (test_crash.py)
    .venv/bin/python -m tests.reliability.crash --store postgres --kills 1000 --seed 1000  # documented, PostgreSQL
    .venv/bin/python -m tests.reliability.crash --store postgres --kills 15 --seed 2 --fsync batch  # CI's share
    .venv/bin/python -m tests.reliability.crash --store postgres --dsn "host=db dbname=empty" --kills 300

It starts ``agentd run`` (fsync ``always`` unless ``--fsync batch``, lease ttl 0.3 s, which
the file store's leases, kept by the daemon lock, never need) on a temp state dir, creates a few conversations on the ``script``
provider (``scripts/crash.toml``: streamed text, tools, a permission, usage,
a title), and then, once per kill, drives turns through the real socket and
kills the daemon with SIGKILL at a moment picked by one of four modes:

* ``append``: a random time in the middle of turns (appends, fsyncs, record writes);
* ``answer``: 0 to 15 ms after a permission answer is sent, before or while it is delivered;
* ``lease``: the instant a lease file's temporary file appears (mid atomic write: a lease taken at start-up);
* ``startup``: right after one of the kills above, the restarted daemon is killed again, half
  the time 0.2 to 1.0 times as long after it starts as the last start took (spawn to the socket
  answering: during its imports, while it opens the store, during recovery, or just after it),
  half the time just after its log says recovery began (0 to 250 ms after ``store.opened`` on
  postgres, 0 to 10 ms after the first ``turn.interrupted`` on files);
  ``startup_kills_mid_recovery`` and ``startup_kills_after_ready`` count where they landed.

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

On the postgres store (``--store postgres``; ``CrashHarness(store="postgres", dsn=...)``) the
daemon runs with ``[store] backend = "postgres"`` on an empty database (``--dsn``; without it a
throwaway cluster from tests/pgcluster.py is started for the run, ``fsync=off``: it proves what a
crash of agentd does, not a crash of the machine), and every check above reads the database
instead of files:

* a journal is the ``journal`` rows of the conversation ordered by seq, which must be 1..n (the
  primary key refuses a duplicate; a gap fails), each rendered as a line by the store's ``line_of``
  and decoded; there is no torn tail (a transaction commits whole or not at all);
* a delivered record must equal its row field by field (seq, type, run, ``ts`` to the millisecond,
  ``data`` byte for byte), and the rendered line must equal the delivered bytes (counted in
  ``records_reformatted`` if not; CI requires 0);
* the harness holds its own ``LISTEN agentd_journal`` connection: every seq a commit's NOTIFY
  announced must be in the table after the restart;
* the record is the ``conversations`` row; it is written by the group commit, so right after the
  restart it may lag recovery by about ``batch_ms`` (the check waits up to ``RECORD_SETTLE_S`` for
  it to be idle; ``record_settle_max_ms``);
* no ``events.jsonl`` may appear under the state dir; ``received.jsonl`` of the script provider
  stays on disk and is checked as above.

The ``lease`` mode (a lease file's temporary file) is replaced there by ``commit``: the kill comes
the instant the harness's LISTEN connection receives the 1st to 40th commit notification of the
drive, that is right after a group commit committed and before the daemon has published (or even
learnt of) it. A commit kill that sees no notification within 1.5 s kills then
(``commit_kills_hit`` counts those that did see one, ``commit_kills_unpublished`` those of them
that came before the subscriber had the announced seq). On postgres the leases are rows of the
database (agentd.hosts), so there is no lease file to watch or check.

Exit status 0 when every check held; 1 (and the state dir kept) at the first
failure. ``--json FILE`` writes the figures (RELIABILITY.md quotes them).
"""

from __future__ import annotations

import argparse
import collections
import datetime
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
fsync = "{fsync}"
[leases]
ttl_s = 0.3
[providers.copilot]
enabled = false
[providers.claude]
enabled = false
"""

MODES = ("append", "answer", "lease", "startup")
#: on postgres the lease file's write gives way to the group commit (see the module docstring)
PG_MODES = ("append", "answer", "commit", "startup")
WEIGHTS = (45, 25, 15, 15)
#: postgres: how long a conversation's row may take to show the record recovery made idle, seconds
RECORD_SETTLE_S = 5.0


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
    #: postgres: the rows as stored, (seq, ts, type, run, data)
    rows: list[PgRow] | None = None


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


# --------------------------------------------------------------------------- where the journals are


class FileJournals:
    """The file store: ``<state>/conversations/<id>/events.jsonl`` and ``record.json``."""

    name = "file"

    def __init__(self, conv_dir: Path) -> None:
        self.conv_dir = conv_dir

    def config(self) -> str:
        return ""

    def journal(self, cid: str) -> JournalState:
        return read_journal(self.conv_dir / cid / "events.jsonl")

    def record(self, cid: str) -> dict[str, Any]:
        path = self.conv_dir / cid / "record.json"
        try:
            return json.loads(path.read_bytes())
        except ValueError as exc:
            raise CheckFailed(f"{path} is not valid JSON: {exc}") from None

    def after_kill(self, cid: str) -> None:
        """What a dead daemon must have left valid besides the journal: record.json and lease.json."""
        for name in ("record.json", "lease.json"):
            path = self.conv_dir / cid / name
            if path.exists():
                try:
                    json.loads(path.read_bytes())
                except ValueError as exc:
                    raise CheckFailed(f"{path} is not valid JSON after the kill: {exc}") from None

    def differs(self, cid: str, state: JournalState, seq: int, raw: bytes) -> str | None:
        """Why the record ``raw`` a subscriber got is not the journal's seq ``seq``; None when it is, byte for byte."""
        if seq > len(state.lines):
            return f"the journal ends at seq {len(state.lines)}"
        if state.lines[seq - 1] != raw:
            return f"the journal holds {state.lines[seq - 1][:200]!r}"
        return None

    def close(self) -> None:
        pass


#: a ``journal`` row as the harness reads it: (seq, ts, type, run, data)
PgRow = tuple[int, "datetime.datetime", str, str, bytes]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class PgJournals:
    """The postgres store: rows of ``journal`` and ``conversations`` in the database at ``dsn``.

    A journal's ``lines`` are its rows rendered as the file journal's lines (the product's
    ``line_of``), and its ``rows`` the columns as stored; :meth:`differs` checks a delivered
    record against both. Nothing of a journal may be on the state dir's disk.
    """

    name = "postgres"

    def __init__(self, dsn: str, conv_dir: Path) -> None:
        import psycopg

        self.dsn = dsn
        self.conv_dir = conv_dir
        self.conn = psycopg.connect(dsn, autocommit=True)
        #: delivered records whose bytes differed from the rendered row while every field matched
        self.reformatted = 0
        have = self.conn.execute("SELECT to_regclass('conversations') IS NOT NULL").fetchone()
        if have and have[0] and self.conn.execute("SELECT count(*) FROM conversations").fetchone()[0]:
            self.conn.close()
            raise ValueError(f"the database at {dsn!r} already holds conversations: the harness needs an empty one")

    def config(self) -> str:
        return f'[store]\nbackend = "postgres"\ndsn = {json.dumps(self.dsn)}\n'

    def journal(self, cid: str) -> JournalState:
        from agentd.store.postgres.journal import line_of

        cur = self.conn.execute(
            "SELECT seq, ts, type, run, data FROM journal WHERE conversation_id = %s ORDER BY seq", (cid,))
        rows: list[PgRow] = [(seq, ts, type_, run, bytes(data)) for seq, ts, type_, run, data in cur]
        lines, records = [], []
        for n, (seq, ts, type_, run, data) in enumerate(rows, 1):
            if seq != n:
                raise CheckFailed(f"postgres journal of {cid}: row {n} has seq {seq} (gap)")
            delta = ts - _EPOCH
            if delta % datetime.timedelta(milliseconds=1):
                raise CheckFailed(f"postgres journal of {cid}: seq {seq} has ts {ts} (not whole milliseconds)")
            line = line_of(seq, delta // datetime.timedelta(milliseconds=1), type_, run, data)
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise CheckFailed(f"postgres journal of {cid}: seq {seq} is not a JSON record ({exc}): {line[:200]!r}") from None
            lines.append(line)
            records.append(rec)
        return JournalState(lines, b"", records, rows)

    def record(self, cid: str) -> dict[str, Any]:
        row = self.conn.execute("SELECT record FROM conversations WHERE id = %s", (cid,)).fetchone()
        if row is None:
            raise CheckFailed(f"postgres: conversation {cid} has no row in conversations")
        try:
            return json.loads(bytes(row[0]))
        except ValueError as exc:
            raise CheckFailed(f"postgres: the record of {cid} is not valid JSON: {exc}") from None

    def after_kill(self, cid: str) -> None:
        if (self.conv_dir / cid / "events.jsonl").exists():
            raise CheckFailed(f"{cid}: an events.jsonl on disk although the store is postgres")
        row = self.conn.execute("SELECT record FROM conversations WHERE id = %s", (cid,)).fetchone()
        if row is not None:
            self.record(cid)
        lease = self.conv_dir / cid / "lease.json"
        if lease.exists():  # the leases are rows of the database
            raise CheckFailed(f"{lease}: a lease file on disk although the store is postgres")

    def differs(self, cid: str, state: JournalState, seq: int, raw: bytes) -> str | None:
        """None when the row at ``seq`` holds the record ``raw``: every field equal (data byte for byte), and
        the row rendered as a line equal to ``raw``, or else counted in :attr:`reformatted`."""
        assert state.rows is not None
        if seq > len(state.rows):
            return f"the journal table ends at seq {len(state.rows)}"
        got = wire.decode_record(raw)
        row_seq, ts, type_, run, data = state.rows[seq - 1]
        if (got.seq, got.type, got.run, bytes(got.data)) != (row_seq, type_, run, data):
            return f"the row holds seq {row_seq} type {type_!r} run {run!r} data {data[:200]!r}"
        if datetime.datetime.fromisoformat(got.ts) != ts:
            return f"the row's ts is {ts.isoformat()}, the record's {got.ts}"
        if state.lines[seq - 1] != raw:
            self.reformatted += 1
        return None

    def close(self) -> None:
        self.conn.close()


class CommitWatch:
    """A LISTEN connection on ``agentd_journal`` the harness holds, read by a thread of its own.

    ``notified`` is the highest seq each conversation's commits announced (a NOTIFY is delivered
    only once its transaction committed, so those rows must be in the table for good);
    :meth:`arm` has ``fire`` called right after the n-th notification from now (the ``commit`` kill).
    """

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("LISTEN agentd_journal")
        self.lock = threading.Lock()
        self.notified: dict[str, int] = {}
        self.seen = 0
        self._armed: list[Any] | None = None  # [notifications left, fire]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for note in self.conn.notifies(timeout=0.1):
                cid, _, seq = note.payload.rpartition(":")
                with self.lock:
                    self.seen += 1
                    self.notified[cid] = max(self.notified.get(cid, 0), int(seq))
                    if self._armed is not None:
                        self._armed[0] -= 1
                        if self._armed[0] <= 0:
                            fire, self._armed = self._armed[1], None
                            fire(cid, int(seq))  # under the lock: disarm() waits for it, so it never hits the next daemon

    def arm(self, n: int, fire: Callable[[str, int], None]) -> None:
        """``fire(conversation, seq)`` right after the n-th notification from now (its payload)."""
        with self.lock:
            self._armed = [n, fire]

    def disarm(self) -> None:
        with self.lock:
            self._armed = None

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.conn.close()


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
    #: postgres: commit kills that landed right after a commit's NOTIFY (the rest hit their deadline)
    commit_kills_hit: int = 0
    #: of those, the kills that came before a subscriber had the committed seq (committed, not yet published)
    commit_kills_unpublished: int = 0
    #: postgres: commit notifications seen, and delivered records whose line bytes differed from the row
    #: rendered as a line while every field matched (0 expected: line_of renders the file journal's bytes)
    commits_seen: int = 0
    records_reformatted: int = 0
    #: postgres: records found not yet idle right after the restart, and the longest wait for their row
    records_settled: int = 0
    record_settle_max_ms: int = 0
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
    #: startup kills that came after the restarted daemon logged agentd.ready (recovery done); the rest cut it
    startup_kills_after_ready: int = 0
    #: startup kills that came after recovery began (the store opened, or a run interrupted) but before agentd.ready
    startup_kills_mid_recovery: int = 0
    restarts: int = 0
    seconds: float = 0.0


class CrashHarness:
    def __init__(self, root: Path, *, seed: int, conversations: int = 3, rotate: int = 40,
                 log: Callable[[str], None] = print, store: str = "file", dsn: str | None = None,
                 fsync: str = "always") -> None:
        """``store``: ``file``, or ``postgres`` on the empty database at ``dsn`` (every check then reads it).

        ``fsync``: the daemon's ``[journal] fsync``, ``always`` or ``batch``; under ``batch`` the file
        store publishes a record once written, not fsynced, which a SIGKILL (not a power loss) cannot take
        back, and the postgres store publishes only once committed, as under ``always``.
        """
        self.root = root
        self.rng = random.Random(seed)
        #: picks the kill modes: a stream of its own, so a seed gives the same modes however the drives' timing
        #: consumed ``rng`` (a short run's test can count on each mode)
        self.mode_rng = random.Random(f"modes-{seed}")
        self.seed = seed
        self.n_convs = conversations
        self.rotate = rotate
        self.log = log
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        if fsync not in ("always", "batch"):
            raise ValueError(f"fsync {fsync!r}: the harness checks always or batch")
        conv_dir = root / "state" / "conversations"
        if store == "postgres":
            if not dsn:
                raise ValueError("store postgres needs a dsn")
            self.journals: FileJournals | PgJournals = PgJournals(dsn, conv_dir)
            self.watch: CommitWatch | None = CommitWatch(dsn)
            self.modes = PG_MODES
        elif store == "file":
            self.journals, self.watch, self.modes = FileJournals(conv_dir), None, MODES
        else:
            raise ValueError(f"unknown store {store!r}")
        self.daemon = Daemon(root, CONFIG.format(fsync=fsync) + self.journals.config(), env={"AGENTD_LOG_LEVEL": "info"})
        self._kill_lock = threading.Lock()
        #: how long the last start took, spawn to the socket answering, seconds
        self.start_s = 1.0
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
        with self._kill_lock:  # the commit watch kills from its own thread
            if not self.killed.is_set():
                self.killed.set()
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def start(self) -> None:
        t0 = time.monotonic()
        self.daemon.start(timeout=30)
        self.start_s = time.monotonic() - t0
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
                last = len(self.journals.journal(conv.id).lines)
                rid = sub.send(wire.Subscribe, conversation=conv.id, after=max(0, last - 10), snapshot=False)
                sub_to_conv[rid] = conv.id
            t0 = time.monotonic()
            kill_at = t0 + (self.rng.uniform(0.02, 1.2) if mode == "append" else 1.5 if mode == "commit" else 3.0)
            if mode == "lease":
                threading.Thread(target=self._kill_on_lease_write, args=(t0 + 1.5,), daemon=True).start()
            elif mode == "commit":
                assert self.watch is not None
                self.watch.arm(self.rng.randint(1, 40), self._kill_on_commit)
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
            if self.watch is not None:
                self.watch.disarm()
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

    def _await_recovery(self, mark: int, timeout: float) -> bool:
        """Return once the daemon started after log offset ``mark`` logs that recovery began (postgres:
        ``store.opened``; either store: a ``turn.interrupted``), or after ``timeout`` s; True on store.opened."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.daemon.log.open("rb") as f:
                f.seek(mark)
                said = f.read()
            if b'"store.opened"' in said:
                return True
            if b'"turn.interrupted"' in said:
                return False
            time.sleep(0.002)
        return False

    def _kill_on_commit(self, cid: str, seq: int) -> None:
        """The commit watch saw a NOTIFY: the transaction committed, the daemon may not know it yet."""
        if not self.killed.is_set():
            self.figures.commit_kills_hit += 1
            with self.lock:
                if seq > max(self.received.get(cid, {0: b""})):
                    self.figures.commit_kills_unpublished += 1
        self.kill()

    def _kill_on_lease_write(self, deadline: float) -> None:
        """Kill the instant a lease file's temporary file exists (mid atomic write)."""
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
            state = self.journals.journal(cid)
            if state.torn:
                self.figures.torn_tails += 1
            self.journals.after_kill(cid)
            snap[cid] = state
        return snap

    def verify(self, before: dict[str, JournalState], first: dict[str, JournalState]) -> None:
        """After a restart: see the module docstring for the list.

        ``before`` is the journals as the last killed daemon left them, ``first``
        as the drive's kill left them (runs cut then must end ``run_interrupted``).
        """
        all_prompts: dict[str, str] = {}
        for cid, pre in before.items():
            post = self.journals.journal(cid)
            self.figures.journal_lines_checked += len(post.lines)
            if post.lines[: len(pre.lines)] != pre.lines:
                raise CheckFailed(f"{cid}: the restart rewrote or dropped journal lines")
            with self.lock:
                received = dict(self.received.get(cid, {}))
            for seq, raw in received.items():
                why = self.journals.differs(cid, post, seq, raw)
                if why:
                    raise CheckFailed(f"{cid}: record seq {seq} was delivered to a subscriber but is not in the "
                                      f"{self.journals.name} journal ({why}): {raw[:200]!r}")
            self.figures.events_checked += len(received)
            if self.watch is not None:
                with self.watch.lock:
                    announced = self.watch.notified.get(cid, 0)
                if announced > len(post.lines):
                    raise CheckFailed(f"{cid}: a commit announced seq {announced} (NOTIFY) but the journal table "
                                      f"ends at {len(post.lines)}")
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
            record = self.journals.record(cid)
            if isinstance(self.journals, PgJournals):
                # The row is written by the group commit up to batch_ms after recovery changed it (the
                # daemon answers meanwhile); a kill before that is caught up from the journal at the next start.
                t_read = time.monotonic()
                while (record.get("active_run") or record.get("state", "idle") != "idle") \
                        and time.monotonic() < t_read + RECORD_SETTLE_S:
                    time.sleep(0.005)
                    record = self.journals.record(cid)
                waited_ms = round((time.monotonic() - t_read) * 1000)
                if waited_ms >= 5:
                    self.figures.records_settled += 1
                    self.figures.record_settle_max_ms = max(self.figures.record_settle_max_ms, waited_ms)
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
            mode = self.mode_rng.choices(self.modes[:3], WEIGHTS[:3])[0]
            self.maybe_rotate(cycle)
            self.drive(mode)
            cycle += 1
            self.figures.kills += 1
            self.figures.modes[mode] += 1
            first = before = self.snapshot()
            # Sometimes kill the next daemon too while it starts: during recovery, or just after.
            while cycle < kills and self.mode_rng.random() < WEIGHTS[3] / 100 * 2:
                self.killed.clear()
                mark = self.daemon.log.stat().st_size if self.daemon.log.exists() else 0
                self.spawn()
                if self.rng.random() < 0.5:
                    # Scaled to how long the last start took: a fixed window missed recovery on a loaded
                    # machine, where the imports alone outlast it.
                    time.sleep(self.rng.uniform(0.2, 1.0) * self.start_s)
                else:
                    # postgres logs store.opened before recovery, which then reads and writes over the
                    # network (some 100s of ms); the file store says nothing until a run is interrupted.
                    opened = self._await_recovery(mark, self.start_s * 2 + 1)
                    time.sleep(self.rng.uniform(0.0, 0.25 if opened else 0.01))
                self.kill()
                cycle += 1
                self.figures.kills += 1
                self.figures.modes["startup"] += 1
                with self.daemon.log.open("rb") as f:
                    f.seek(mark)
                    said = f.read()
                if b'"agentd.ready"' in said:
                    self.figures.startup_kills_after_ready += 1
                elif b'"turn.interrupted"' in said or b'"store.opened"' in said:
                    self.figures.startup_kills_mid_recovery += 1
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
            self.figures.journal_lines_checked += len(self.journals.journal(cid).lines)
        if self.watch is not None:
            self.figures.commits_seen = self.watch.seen
        if isinstance(self.journals, PgJournals):
            self.figures.records_reformatted = self.journals.reformatted
        self.figures.seconds = round(time.monotonic() - t0, 1)
        return self.figures

    def dump_journals(self, into: Path) -> Path:
        """Write every journal the harness made, as its backend reads them, to ``into/<id>.jsonl``; ``into``."""
        into.mkdir(parents=True, exist_ok=True)
        for cid in [*self.retired, *(c.id for c in self.convs)]:
            try:
                lines = self.journals.journal(cid).lines
            except CheckFailed as exc:
                lines = [f"(unreadable: {exc})".encode()]
            (into / f"{cid}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        return into

    def close(self) -> None:
        """Kill a daemon still running (after a failure) and close the database connections."""
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.proc.kill()
            self.daemon.proc.wait()
        if self.watch is not None:
            self.watch.close()
        self.journals.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.crash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="how many SIGKILLs (default 1000)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--conversations", type=int, default=3, help="conversations driven at once (default 3)")
    parser.add_argument("--rotate", type=int, default=40, help="new conversations every N kills (default 40)")
    parser.add_argument("--dir", type=Path, default=None, help="work here instead of a temp dir (kept)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    parser.add_argument("--fsync", choices=("always", "batch"), default="always",
                        help="the daemon's [journal] fsync (default always; batch is the shipped default)")
    parser.add_argument("--store", choices=("file", "postgres"), default="file",
                        help="the daemon's [store] backend, which every check reads (default file)")
    parser.add_argument("--dsn", default=None,
                        help="postgres: an empty database (libpq DSN or URI); default: a throwaway cluster "
                             "(tests/pgcluster.py, fsync off) started for the run")
    args = parser.parse_args(argv)
    if args.dsn and args.store != "postgres":
        parser.error("--dsn goes with --store postgres")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="agentd-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    cluster = None
    dsn = args.dsn
    if args.store == "postgres" and not dsn:
        from pgcluster import PgCluster, find_bindir

        bindir = find_bindir()
        if bindir is None:
            print("[crash] no PostgreSQL installed (apt-get install postgresql), and no --dsn", file=sys.stderr)
            return 2
        cluster = PgCluster(bindir).start()
        dsn = cluster.dsn(cluster.create_database("agentd_crash"))
    print(f"[crash] seed {seed}, {args.kills} kills, store {args.store}, fsync {args.fsync}, state in {root}", flush=True)
    try:
        try:
            harness = CrashHarness(root, seed=seed, conversations=args.conversations, rotate=args.rotate,
                                   log=lambda s: print(s, flush=True), store=args.store, dsn=dsn,
                                   fsync=args.fsync)
        except ValueError as exc:
            print(f"[crash] {exc}", file=sys.stderr)
            return 2
        try:
            figures = harness.run(args.kills)
        except CheckFailed as exc:
            print("\n".join(harness.trace), file=sys.stderr)
            print(f"[crash] FAILED after {harness.figures.kills} kills (seed {seed}, store {args.store}): {exc}\n"
                  f"[crash] state kept in {root}; daemon log {harness.daemon.log}", file=sys.stderr)
            if isinstance(harness.journals, PgJournals):
                dumped = harness.dump_journals(root / "pg-journals")
                print(f"[crash] the journals as the database holds them: {dumped}", file=sys.stderr)
            return 1
        finally:
            harness.close()
    finally:
        if cluster is not None:
            cluster.stop()
    out = {"seed": seed, "store": args.store, "fsync": args.fsync, **figures.__dict__, "modes": dict(figures.modes)}
    print("[crash] OK " + json.dumps(out), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
