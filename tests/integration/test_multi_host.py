"""Two and three real agentd processes on separate state dirs sharing one real PostgreSQL
(``[store] backend = "postgres"``, agentd.hosts): a conversation made on host A is listed, shown,
read, tailed from a seq and driven (send, answer) from host B; a SIGKILL of A mid-turn is noticed
on B once A's leases expire, and the turn ends once, ``run_interrupted``, its prompt never resent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import REPO, Daemon
from pgcluster import PgDatabase

SCRIPTS = REPO / "conf" / "scripts"
TTL_S = 1.5
#: a host that runs one task at a time
ONE_PLACE = "[tasks]\nconcurrency = 1\n"


def _json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def _eventually(what: Callable[[], Any], timeout: float = 15.0, why: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, why or "condition never held"
        time.sleep(0.05)


def _new(d: Daemon, work: Path, script: str) -> str:
    """A conversation on ``d``'s script provider playing conf/scripts/``script``; its id."""
    return _json(d.agentctl("new", "-p", "script", "-m", str(SCRIPTS / script), "--cwd", str(work), "--json"))["id"]


def _listed(d: Daemon) -> list[str]:
    return [c["id"] for c in _json(d.agentctl("ls", "--all", "--json"))["conversations"]]


def _tail(d: Daemon, cid: str, *args: str) -> list[dict[str, Any]]:
    cp = d.agentctl("tail", cid, "--no-follow", "--json", *args)
    assert cp.returncode == 0, cp.stderr
    return [json.loads(line) for line in cp.stdout.splitlines()][:-1]  # the last line is the snapshot


def _live_lease(dsn: str, cid: str) -> str:
    """The owner of the unexpired lease on ``cid``, "" when there is none."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT owner FROM leases WHERE key = %s AND expires_at > now()", (cid,)).fetchone()
    return row[0] if row else ""


def _lease_left_s(dsn: str, cid: str) -> float:
    """Seconds until the lease on ``cid`` expires, by the database's clock (0: none, or expired)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT extract(epoch FROM expires_at - now())::float8 FROM leases WHERE key = %s",
                           (cid,)).fetchone()
    return max(row[0], 0.0) if row else 0.0


def _ends(records: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    return [x for x in records if x["type"] == "turn" and x.get("run") == run
            and x["data"]["state"] in ("completed", "failed", "cancelled")]


def _seqs(dsn: str, cid: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT seq FROM journal WHERE conversation_id = %s ORDER BY seq", (cid,))]


class _Follower:
    """``agentctl tail CID --after N --json`` on a host, read in the background."""

    def __init__(self, d: Daemon, cid: str, after: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agentctl", "--socket", str(d.socket), "tail", cid,
                                      "--after", str(after), "--json"],
                                     env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def records(self) -> list[dict[str, Any]]:
        return [x for x in self.lines if "seq" in x]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class _Cluster:
    """Hosts on separate state dirs under one test's tmp dir sharing ``dsn``, a ``work`` dir for their
    conversations, and the tails followed on them; :meth:`close` ends every tail, then every host."""

    def __init__(self, root: Path, dsn: str) -> None:
        self.root, self.dsn = root, dsn
        self.work = root / "work"
        self.work.mkdir()
        self._daemons: list[Daemon] = []
        self._followers: list[_Follower] = []

    def start(self, names: str = "ab", extra: str = "") -> list[Daemon]:
        """A host started for each letter of ``names`` (its state dir), ``extra`` added to the config."""
        config = f'[store]\nbackend = "postgres"\ndsn = "{self.dsn}"\n[leases]\nttl_s = {TTL_S}\n{extra}'
        out = []
        for name in names:
            (self.root / name).mkdir()
            out.append(Daemon(self.root / name, config).start())
        self._daemons += out
        return out

    def follow(self, d: Daemon, cid: str, after: int) -> _Follower:
        f = _Follower(d, cid, after)
        self._followers.append(f)
        return f

    def close(self) -> None:
        for f in self._followers:
            if f.proc.poll() is None:
                f.stop()
        for d in self._daemons:
            d.stop()


@pytest.fixture
def cluster(tmp_path: Path, pg_db: PgDatabase) -> Iterator[_Cluster]:
    hosts = _Cluster(tmp_path, pg_db.dsn)
    try:
        yield hosts
    finally:
        hosts.close()


def test_a_conversation_made_on_one_host_is_read_tailed_and_driven_from_another(pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    made = a.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(work),
                      "hello from A", "--json", timeout=60)
    assert made.returncode == 0, made.stderr
    cid = json.loads(made.stdout.splitlines()[-1])["conversation"]
    # Listed and shown on B at once (NOTIFY agentd_record), read from the database.
    _eventually(lambda: cid in _listed(b), why="B never listed A's conversation")
    shown = _json(b.agentctl("show", cid, "--json"))
    assert shown["record"]["site"].endswith(str(a.state_dir)) and shown["record"]["state"] == "idle"
    first = _tail(b, cid)
    assert [r["seq"] for r in first] == _seqs(pg_db.dsn, cid) == list(range(1, len(first) + 1))
    assert _tail(b, cid, "--after", "2") == first[2:]
    history = _json(b.agentctl("history", cid, "--json"))
    assert [e["item"]["text"] for e in history["items"] if e["item"]["kind"] == "user"] == ["hello from A"]

    # B tails from a seq while A runs a turn that B sent (carried to A, the lease holder).
    follower = cluster.follow(b, cid, after=len(first) - 1)
    _eventually(lambda: follower.records(), why="B's tail never replayed the last record")
    sent = b.agentctl("send", cid, "and hello from B", "--json")
    assert sent.returncode == 0, sent.stderr
    run = json.loads(sent.stdout)["run"]
    _eventually(lambda: any(x["type"] == "turn" and x.get("run") == run and x["data"]["state"] == "completed"
                            for x in follower.records()), why="B's tail never saw the carried turn end")
    seen = [x["seq"] for x in follower.records()]
    assert seen == list(range(len(first), seen[-1] + 1)), f"gap or duplicate in B's live tail: {seen}"
    prompts = [x for x in _tail(a, cid) if x["type"] == "prompt"]
    assert [json.loads(json.dumps(p["data"]))["text"] for p in prompts][-1] == "and hello from B"
    assert _tail(a, cid) == _tail(b, cid)

    # A permission asked on A's runtime, answered on B.
    d = a.agentctl("new", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(work), "--json")
    tool = _json(d)["id"]
    _eventually(lambda: tool in _listed(b))
    assert b.agentctl("send", tool, "write the file").returncode == 0
    pending = _eventually(lambda: _json(b.agentctl("show", tool, "--json")).get("pending"),
                          why="B's show never had A's pending permission")
    answered = b.agentctl("answer", tool, pending[0]["id"], "--allow")
    assert answered.returncode == 0, answered.stderr
    _eventually(lambda: (work / "agentd-tool.txt").exists(), why="the answer from B never reached A's runtime")
    _eventually(lambda: _json(b.agentctl("show", tool, "--json"))["record"]["state"] == "idle")

    # Record changes asked on B are made by A, which holds the conversation; so is a removal.
    assert b.agentctl("title", cid, "renamed on B").returncode == 0
    assert _json(a.agentctl("show", cid, "--json"))["record"]["title"] == "renamed on B"
    removed = b.agentctl("rm", tool)
    assert removed.returncode == 0, removed.stderr
    _eventually(lambda: tool not in _listed(a) and tool not in _listed(b), why="the removal did not reach both")
    assert _seqs(pg_db.dsn, tool) == []
    # Host tools belong to the agentd that runs the conversation: B says so.
    with b.client() as client:
        try:
            client.request(wire.RegisterTool, conversation=cid, name="stamp", description="d",
                           input_schema={"type": "object"})
        except c.AgentdError as exc:
            assert exc.code == "unsupported" and "another agentd host" in exc.message, exc
        else:
            raise AssertionError("B registered a host tool for a conversation A runs")


def test_a_host_killed_mid_turn_is_noticed_by_the_others_and_its_turn_ends_once(pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b, c = cluster.start("abc")
    cid = _new(a, work, "wait.toml")
    sent = a.agentctl("send", cid, "work until cancelled", "--json")
    assert sent.returncode == 0, sent.stderr
    run = json.loads(sent.stdout)["run"]
    _eventually(lambda: cid in _listed(b) and cid in _listed(c))
    _eventually(lambda: any(x["type"] == "item" for x in _tail(b, cid)))
    a.stop(sig=signal.SIGKILL)
    killed = time.monotonic()
    left = _lease_left_s(pg_db.dsn, cid)  # A is dead: its lease lasts exactly this much longer
    # B or C takes the lease over after it expired and ends the turn, once, without resending it.
    ends = _eventually(lambda: _ends(_tail(c, cid), run), timeout=TTL_S * 10 + 15,
                       why="no host ended the dead host's turn")
    assert time.monotonic() - killed >= left - 0.1, (left, [(x["seq"], x["type"]) for x in _tail(c, cid)])
    time.sleep(TTL_S * 2)  # every host has had rounds to (wrongly) end it again
    records = _tail(b, cid)
    ends = _ends(records, run)
    assert len(ends) == 1 and ends[0]["data"]["state"] == "failed", ends
    assert ends[0]["data"]["reason"] == "run_interrupted", ends
    assert [x["type"] for x in records].count("prompt") == 1
    assert [x["seq"] for x in records] == list(range(1, len(records) + 1))
    taken = [x for x in records if x["type"] == "lease" and x["data"]["action"] == "taken_over"]
    assert len(taken) == 1 and taken[0]["data"]["previous_owner"], taken
    assert _json(b.agentctl("show", cid, "--json"))["record"]["state"] == "idle"
    hosts = {h["site"].split(":", 1)[1]: h for h in _json(b.agentctl("hosts", "--json"))["hosts"]}
    assert not hosts[str(a.state_dir)]["alive"] and hosts[str(a.state_dir)]["leases"] == 0
    assert hosts[str(b.state_dir)]["alive"] and hosts[str(b.state_dir)]["this"]
    assert hosts[str(c.state_dir)]["alive"] and "script" in hosts[str(c.state_dir)]["providers"]
    # Its runtime's session is on A's disk: no other host opens it, and the error says why.
    refused = b.agentctl("send", cid, "anyone?")
    assert refused.returncode != 0 and "not running" in refused.stderr and str(a.state_dir) in refused.stderr
    # A comes back: it runs the conversation again.
    a.start()
    again = a.agentctl("send", cid, "steer me later", "--json")
    assert again.returncode == 0, again.stderr


def _task(d: Daemon, tid: str) -> dict[str, Any]:
    return _json(d.agentctl("task", "show", tid, "--json"))["task"]


def test_tasks_queued_on_one_host_run_on_a_host_with_a_free_place_and_a_dead_hosts_task_ends_once(
        cluster: _Cluster) -> None:
    work = cluster.work
    [a] = cluster.start("a", ONE_PLACE)
    def create(d: Daemon, script: str, text: str) -> str:
        cp = d.agentctl("task", "create", "-p", "script", "-m", str(SCRIPTS / script), "--cwd", str(work), text,
                        "--json")
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)["id"]

    # A's one place is taken by a task that waits until cancelled; the next one waits for a place.
    long = create(a, "wait.toml", "wait here")
    _eventually(lambda: _task(a, long)["status"] == "running", why="A never started its task")
    queued = create(a, "echo.toml", "quick one")
    time.sleep(TTL_S)
    assert _task(a, queued)["status"] == "pending"
    # B comes up with a free place: it claims the queued task and runs it; A sees it end.
    [b] = cluster.start("b", ONE_PLACE)
    done = _eventually(lambda: _task(a, queued)["status"] == "completed" and _task(a, queued),
                       why="the task queued on A never completed")
    assert _json(b.agentctl("show", done["conversation"], "--json"))["record"]["site"].endswith(str(b.state_dir))
    listed = {t["id"] for t in _json(b.agentctl("task", "ls", "--json"))["tasks"]}
    assert {long, queued} <= listed
    # A task running on A cannot be cancelled as a task from B; the error says how.
    refused = b.agentctl("task", "cancel", long)
    assert refused.returncode != 0 and "another agentd host" in refused.stderr, refused.stderr
    # A dies with its task running: B ends it once, run_interrupted, and never runs it again.
    a.stop(sig=signal.SIGKILL)
    ended = _eventually(lambda: (t := _task(b, long))["status"] == "failed" and t, timeout=TTL_S * 10 + 15,
                        why="the dead host's running task never ended")
    assert ended["reason"] == "run_interrupted", ended
    records = _tail(b, ended["conversation"])
    prompts = [x for x in records if x["type"] == "prompt"]
    assert len(prompts) == 1
    assert len(_ends(records, prompts[0]["run"])) == 1
    time.sleep(TTL_S * 2)
    assert _task(b, long)["status"] == "failed"
    assert len(_ends(_tail(b, ended["conversation"]), prompts[0]["run"])) == 1


def _db_records(dsn: str, cid: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT seq, line FROM journal WHERE conversation_id = %s ORDER BY seq", (cid,)).fetchall()
    return [json.loads(line) if isinstance(line, str) else json.loads(bytes(line)) for _, line in rows]


def test_a_host_stalled_past_its_ttl_comes_back_without_writing_over_the_turn_another_host_ended(
        pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "wait.toml")
    run = _json(a.agentctl("send", cid, "work until cancelled", "--json"))["run"]
    _eventually(lambda: cid in _listed(b))
    _eventually(lambda: any(x["type"] == "item" for x in _tail(b, cid)))
    follower = cluster.follow(a, cid, after=0)  # a subscriber on the stalled host
    _eventually(lambda: follower.records())
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        _eventually(lambda: _ends(_tail(b, cid), run), timeout=TTL_S * 10 + 10,
                    why="B never ended the stalled host's turn")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    time.sleep(TTL_S * 2)  # A's renewal rounds find the lease lost
    assert a.proc.poll() is None, "the stalled host died"
    seqs = _seqs(pg_db.dsn, cid)
    assert seqs == list(range(1, len(seqs) + 1))
    records = _tail(b, cid)
    assert len(_ends(records, run)) == 1, _ends(records, run)
    # A's view converges with the database's: idle, the same journal.
    _eventually(lambda: _json(a.agentctl("show", cid, "--json"))["record"]["state"] == "idle",
                timeout=TTL_S * 4, why="A still thinks its lost turn runs")
    assert _tail(a, cid) == _tail(b, cid)
    # A's subscriber saw the other host's end of the turn, each seq once.
    _eventually(lambda: _ends(follower.records(), run), timeout=TTL_S * 4,
                why="A's subscriber never saw the turn end")
    seen = [x["seq"] for x in follower.records()]
    assert seen == list(range(1, seen[-1] + 1)), seen
    # A is not wedged: a new turn sent from either host runs on A and ends once.
    run2 = _json(b.agentctl("send", cid, "again", "--json"))["run"]
    _eventually(lambda: any(x["type"] == "item" and x.get("run") == run2 for x in _tail(b, cid)))
    cancelled = a.agentctl("cancel", cid)
    assert cancelled.returncode == 0, cancelled.stderr
    _eventually(lambda: _ends(_tail(b, cid), run2), why="the new turn never ended")
    seqs = _seqs(pg_db.dsn, cid)
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(_ends(_tail(b, cid), run)) == 1 and len(_ends(_tail(b, cid), run2)) == 1


def _at_once(*calls: tuple[Daemon, tuple[str, ...]]) -> list[subprocess.CompletedProcess[str]]:
    """``agentctl`` commands started together, each on its host; their results in order."""
    procs = [subprocess.Popen([sys.executable, "-m", "agentctl", "--socket", str(d.socket), *args], env=d.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d, args in calls]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_sends_from_two_hosts_at_once_run_one_and_the_other_is_refused_or_queued(pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "wait.toml")
    _eventually(lambda: cid in _listed(b))
    for _ in range(2):  # --if-busy reject: exactly one runs, the other is told busy (exit 7)
        sent = _at_once((a, ("send", cid, "from A", "--json")), (b, ("send", cid, "from B", "--json")))
        ok = [s for s in sent if s.returncode == 0]
        assert len(ok) == 1 and sorted(s.returncode for s in sent) == [0, 7], [(s.returncode, s.stderr) for s in sent]
        run = json.loads(ok[0].stdout)["run"]
        assert a.agentctl("cancel", cid).returncode == 0
        _eventually(lambda: _ends(_tail(b, cid), run), why="the turn never ended")
    # --if-busy queue: both are taken, one runs and the other waits behind it; nothing is lost.
    sent = _at_once((a, ("send", cid, "queued A", "--if-busy", "queue", "--json")),
                    (b, ("send", cid, "queued B", "--if-busy", "queue", "--json")))
    assert [s.returncode for s in sent] == [0, 0], [s.stderr for s in sent]
    results = [json.loads(s.stdout) for s in sent]
    assert sorted(r["disposition"] for r in results) == ["queued", "started"], results
    for r in sorted(results, key=lambda r: r["disposition"] != "started"):
        _eventually(lambda: any(x["type"] == "item" and x.get("run") == r["run"] for x in _tail(b, cid)),
                    why=f"run {r} never started")
        assert b.agentctl("cancel", cid).returncode == 0
        _eventually(lambda: _ends(_tail(b, cid), r["run"]), why=f"run {r} never ended")
    records = _tail(b, cid)
    prompts = [x["data"]["text"] for x in records if x["type"] == "prompt"]
    assert prompts.count("queued A") == 1 and prompts.count("queued B") == 1, prompts
    assert [x["seq"] for x in records] == _seqs(pg_db.dsn, cid) == list(range(1, len(records) + 1))


def _terminate(dsn: str, application_name: str) -> int:
    """pg_terminate_backend of every backend of ``application_name``; how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
                            "AND pid <> pg_backend_pid()", (application_name,)).fetchall()
    return len(rows)


def test_a_tail_on_another_host_sees_each_seq_once_across_its_listen_connection_killed(
        pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "slow.toml")
    _eventually(lambda: cid in _listed(b))
    follower = cluster.follow(b, cid, after=0)
    _eventually(lambda: follower.records(), why="B's tail never replayed the journal")
    run = _json(a.agentctl("send", cid, "take your time", "--json"))["run"]
    _eventually(lambda: any(x.get("run") == run and x["seq"] for x in follower.records()),
                why="B's tail never saw the turn start")
    for _ in range(3):  # mid-turn, the LISTEN connections (B's among them) are killed, once back each time
        time.sleep(0.3)
        _eventually(lambda: _terminate(pg_db.dsn, "agentd-listen") >= 1, timeout=10,
                    why="no LISTEN connection came back to be killed")
    _eventually(lambda: _ends(_tail(a, cid), run), why="the turn never ended")
    _eventually(lambda: _ends([x for x in follower.records() if x["seq"]], run), timeout=10,
                why="B's tail never saw the turn end")
    seen = [x["seq"] for x in follower.records() if x["seq"]]
    assert seen == _seqs(pg_db.dsn, cid) == list(range(1, len(seen) + 1)), seen
    assert follower.proc.poll() is None  # still following


@pytest.mark.parametrize(("OUTAGE_S", "cancel"), [(TTL_S / 2, False), (TTL_S * 2, False), (TTL_S / 5, True)])
def test_the_database_gone_mid_turn_takes_no_host_down_and_the_hosts_converge(
        pg_db: PgDatabase, cluster: _Cluster, OUTAGE_S: float, cancel: bool) -> None:
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "slow.toml")
    _eventually(lambda: cid in _listed(b))
    run = _json(b.agentctl("send", cid, "take your time", "--json"))["run"]
    _eventually(lambda: any(x.get("run") == run for x in _tail(b, cid)))
    time.sleep(0.5)
    # The database refuses connections for OUTAGE_S and every agentd connection is cut.
    pg_db.cluster.execute(f'ALTER DATABASE "{pg_db.name}" WITH ALLOW_CONNECTIONS false')
    try:
        assert _terminate(pg_db.cluster.dsn(), "agentd") + _terminate(pg_db.cluster.dsn(), "agentd-listen") >= 1
        if cancel:  # the holder ends the turn meanwhile: its end cannot be committed yet
            assert a.agentctl("cancel", cid, timeout=30).returncode == 0
        time.sleep(OUTAGE_S)
    finally:
        pg_db.cluster.execute(f'ALTER DATABASE "{pg_db.name}" WITH ALLOW_CONNECTIONS true')
    ends = _eventually(lambda: _ends(_tail(b, cid), run), why="the turn never ended")
    assert len(ends) == 1, ends
    assert a.proc is not None and b.proc is not None
    assert a.proc.poll() is None and b.proc.poll() is None, "a host died"
    _eventually(lambda: _tail(a, cid) == _tail(b, cid), why="the hosts never agreed on the journal")
    seqs = _seqs(pg_db.dsn, cid)
    assert [x["seq"] for x in _tail(b, cid)] == seqs == list(range(1, len(seqs) + 1))
    # The conversation takes turns again, sent from either host.
    for d in (a, b):
        again = d.agentctl("send", cid, "once more", "--json")
        assert again.returncode == 0, again.stderr
        run = json.loads(again.stdout)["run"]
        assert d.agentctl("cancel", cid).returncode == 0
        assert [x["data"]["state"] for x in _eventually(lambda: _ends(_tail(b, cid), run))] == ["cancelled"]
    assert _json(b.agentctl("show", cid, "--json"))["record"]["state"] == "idle"


def test_close_title_and_rm_from_a_host_that_does_not_run_the_conversation(pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    def new(script: str) -> str:
        cid = _new(a, work, script)
        _eventually(lambda: cid in _listed(b))
        return cid

    # close from B while A runs a turn: the turn ends, the conversation is closed on both.
    busy = new("wait.toml")
    run = _json(a.agentctl("send", busy, "work until cancelled", "--json"))["run"]
    _eventually(lambda: any(x["type"] == "item" for x in _tail(b, busy)))
    closed = b.agentctl("close", busy)
    assert closed.returncode == 0, closed.stderr
    assert len(_ends(_tail(b, busy), run)) == 1
    for d in (a, b):
        _eventually(lambda: _json(d.agentctl("show", busy, "--json"))["record"]["state"] == "closed",
                    why="the close did not reach both")
    # rm from B while tails follow it on both hosts: each tail ends, nobody lists it.
    gone = new("echo.toml")
    assert a.agentctl("send", gone, "hi", "--follow").returncode == 0
    followers = [cluster.follow(a, gone, after=0), cluster.follow(b, gone, after=0)]
    _eventually(lambda: all(f.records() for f in followers))
    removed = b.agentctl("rm", gone)
    assert removed.returncode == 0, removed.stderr
    for f in followers:
        f.proc.wait(10)
    _eventually(lambda: gone not in _listed(a) and gone not in _listed(b))
    assert _seqs(pg_db.dsn, gone) == []
    # title and rm from B while A, its site, is stopped: answered from the database.
    idle = new("echo.toml")
    other = new("echo.toml")
    a.stop()
    assert b.agentctl("title", idle, "named on B").returncode == 0
    assert b.agentctl("rm", other).returncode == 0
    a.start()
    assert _json(a.agentctl("show", idle, "--json"))["record"]["title"] == "named on B"
    assert other not in _listed(a)
    assert a.agentctl("send", idle, "hi again", "--follow").returncode == 0


def test_a_host_restarted_cleanly_serves_its_conversations_again_and_meanwhile_others_name_its_site(
        pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    cids = [_new(a, work, "wait.toml") for _ in range(2)]
    _eventually(lambda: set(cids) <= set(_listed(b)))
    run = _json(b.agentctl("send", cids[0], "first", "--json"))["run"]
    assert b.agentctl("cancel", cids[0]).returncode == 0
    _eventually(lambda: _ends(_tail(b, cids[0]), run))
    assert a.stop() == 0
    for cid in cids:  # at once, naming A's site; nothing queued
        for args in (("send", cid, "while A is down"), ("steer", cid, "now")):  # (cancel: nothing runs)
            refused = b.agentctl(*args)
            assert refused.returncode != 0 and "not running" in refused.stderr, (args, refused.stderr)
            assert str(a.state_dir) in refused.stderr
    a.start()
    # Sends from both hosts at once, for an idle conversation nobody has loaded: one runs.
    for cid in cids:
        sent = _at_once((a, ("send", cid, "from A", "--json")), (b, ("send", cid, "from B", "--json")))
        assert sorted(s.returncode for s in sent) == [0, 7], [(s.returncode, s.stderr) for s in sent]
        run = json.loads(next(s for s in sent if s.returncode == 0).stdout)["run"]
        assert b.agentctl("cancel", cid).returncode == 0
        _eventually(lambda: _ends(_tail(b, cid), run), why="the turn after the restart never ended")
        records = _tail(b, cid)
        assert [x["data"]["text"] for x in records if x["type"] == "prompt"][-1] in ("from A", "from B")
        assert not [x for x in records if x["type"] == "prompt" and x["data"]["text"] == "while A is down"]
        assert [x["seq"] for x in records] == _seqs(pg_db.dsn, cid) == list(range(1, len(records) + 1))


def test_tasks_queued_from_several_hosts_at_once_each_run_once_and_a_killed_hosts_tasks_run_elsewhere(
        cluster: _Cluster) -> None:
    work = cluster.work
    a, b, c = hosts = cluster.start("abc", ONE_PLACE)
    create = ("task", "create", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(work))
    made = _at_once(*[(d, (*create, f"task {d.root.name}{i}", "--json")) for i in range(3) for d in hosts])
    tids = [_json(m)["id"] for m in made]
    # A dies at once with tasks of its own just queued (some claimed by it, maybe): they run elsewhere.
    late = [_json(a.agentctl(*create, f"late {i}", "--json"))["id"] for i in range(3)]
    a.stop(sig=signal.SIGKILL)
    tids += late

    def done() -> list[dict[str, Any]] | None:
        tasks = [_task(b, t) for t in tids]
        return tasks if all(t["status"] in ("completed", "failed", "cancelled") for t in tasks) else None

    tasks = _eventually(done, timeout=TTL_S * 10 + 15, why="not every task ended")
    # One A had marked running but not yet given a conversation when it died ends so, once.
    unborn = [t for t in tasks if not t["conversation"]]
    assert all(t["status"] == "failed" and t["reason"] == "run_interrupted" for t in unborn), unborn
    tasks = [t for t in tasks if t["conversation"]]
    for t in tasks:
        records = _tail(b, t["conversation"])
        prompts = [x for x in records if x["type"] == "prompt"]
        assert len(prompts) == 1 and len(_ends(records, prompts[0]["run"])) == 1, (t, prompts)
    assert len({t["conversation"] for t in tasks}) == len(tids) - len(unborn)
    assert len(unborn) <= 1  # A runs one task at a time
    for t in tasks:  # each completed, but one A was running when it died: that ended run_interrupted
        on_a = _json(b.agentctl("show", t["conversation"], "--json"))["record"]["site"].endswith(str(a.state_dir))
        assert t["status"] == "completed" or (on_a and t["status"] == "failed"
                                              and t["reason"] == "run_interrupted"), (t, on_a)


def test_a_host_stalled_mid_stream_comes_back_to_a_journal_another_host_wrote_on(pg_db: PgDatabase, cluster: _Cluster) -> None:
    """The stalled holder's runtime goes on streaming when it wakes: what it appends before its
    renewal finds the lease lost is refused by the database, never journaled over the new holder's."""
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "slow.toml")
    _eventually(lambda: cid in _listed(b))
    follower = cluster.follow(b, cid, after=0)
    run = _json(a.agentctl("send", cid, "take your time", "--json"))["run"]
    _eventually(lambda: any(x["type"] == "item" and x.get("run") == run for x in _tail(b, cid)))
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        _eventually(lambda: _ends(_tail(b, cid), run), timeout=TTL_S * 10 + 10, why="B never ended the turn")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    time.sleep(TTL_S * 2)
    assert a.proc.poll() is None
    records = _tail(b, cid)
    assert len(_ends(records, run)) == 1 and _ends(records, run)[0]["data"]["reason"] == "run_interrupted"
    assert [x["seq"] for x in records] == _seqs(pg_db.dsn, cid) == list(range(1, len(records) + 1))
    _eventually(lambda: _tail(a, cid) == _tail(b, cid), timeout=TTL_S * 4, why="A never caught up")
    seen = [x["seq"] for x in follower.records() if x["seq"]]
    assert seen == list(range(1, len(records) + 1)), seen
    run2 = _json(b.agentctl("send", cid, "again", "--json"))["run"]
    _eventually(lambda: any(x.get("run") == run2 for x in _tail(b, cid)))
    assert b.agentctl("cancel", cid).returncode == 0
    assert len(_eventually(lambda: _ends(_tail(b, cid), run2), why="the next turn never ended")) == 1


def test_a_send_carried_to_a_holder_that_stalls_past_its_ttl_runs_once_or_fails_saying_so(
        pg_db: PgDatabase, cluster: _Cluster) -> None:
    work = cluster.work
    a, b = cluster.start()
    cid = _new(a, work, "echo.toml")
    _eventually(lambda: cid in _listed(b))
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        sender = subprocess.Popen([sys.executable, "-m", "agentctl", "--socket", str(b.socket), "send", cid,
                                   "carried while A stalls", "--json"], env=b.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        # Past A's TTL: its lease on the idle conversation is gone (deleted by B: nothing to end).
        _eventually(lambda: not _live_lease(pg_db.dsn, cid), timeout=TTL_S * 10 + 10,
                    why="A's lease outlived its TTL")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    out, err = sender.communicate(timeout=60)
    time.sleep(TTL_S * 2)
    records = _tail(b, cid)
    prompts = [x for x in records if x["type"] == "prompt" and x["data"]["text"] == "carried while A stalls"]
    if sender.returncode == 0:  # accepted: it is journaled once and its turn ends once
        run = json.loads(out)["run"]
        assert [p["run"] for p in prompts] == [run], (out, records)
        _eventually(lambda: _ends(_tail(b, cid), run), why="the accepted send's turn never ended")
    else:  # refused: it says why, and it never runs later
        assert prompts == [], (err, records)
        assert err.strip(), "refused without a reason"
    assert [x["seq"] for x in _tail(b, cid)] == _seqs(pg_db.dsn, cid)
    again = b.agentctl("send", cid, "afterwards", "--follow")
    assert again.returncode == 0, again.stderr
