"""The real daemon on ``[store] backend = "postgres"`` (one host) against a real PostgreSQL: a
conversation made, a turn run on the script provider, the daemon restarted (cleanly, then killed),
and ``ls``/``show``/``history``/``tail`` still right; nothing of the journal on the state dir's disk."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from daemon_harness import REPO, Daemon
from pgcluster import PgDatabase

SCRIPTS = REPO / "conf" / "scripts"


def _json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def _lines(cp: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert cp.returncode == 0, cp.stderr
    return [json.loads(line) for line in cp.stdout.splitlines()]


def _db_seqs(dsn: str, cid: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT seq FROM journal WHERE conversation_id = %s ORDER BY seq", (cid,))]


def test_a_turn_on_the_postgres_store_survives_restarts(tmp_path: Path, pg_db: PgDatabase) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = Daemon(tmp_path, f'[store]\nbackend = "postgres"\ndsn = "{pg_db.dsn}"\n').start()
    try:
        run = _lines(d.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(work),
                                "hello there", "--json", timeout=60))
        cid = run[-1]["conversation"]
        tail = _lines(d.agentctl("tail", cid, "--no-follow", "--json"))
        seqs = [x["seq"] for x in tail[:-1]]
        assert seqs == list(range(1, len(tail))) and tail[0]["type"] == "conversation"
        assert any(x["type"] == "turn" and x["data"]["state"] == "completed" for x in tail)
        # In the database, not on this host's disk.
        assert _db_seqs(pg_db.dsn, cid) == seqs
        assert not (d.state_dir / "conversations" / cid / "events.jsonl").exists()
        history = _json(d.agentctl("history", cid, "--json"))
        assert [e["item"]["text"] for e in history["items"] if e["item"]["kind"] == "user"] == ["hello there"]
        d.stop()

        d.start()
        listed = [c["id"] for c in _json(d.agentctl("ls", "--json"))["conversations"]]
        assert cid in listed
        assert _json(d.agentctl("show", cid, "--json"))["record"]["state"] == "idle"
        again = _lines(d.agentctl("tail", cid, "--after", "3", "--no-follow", "--json"))
        assert [x["seq"] for x in again[:-1]] == seqs[3:]
        assert _json(d.agentctl("history", cid, "--json"))["items"] == history["items"]

        # A second turn, then SIGKILL: what was acknowledged is in the database, seq without a gap.
        sent = _lines(d.agentctl("send", cid, "once more", "--json", "--follow", timeout=60))
        assert sent
        before = _lines(d.agentctl("tail", cid, "--no-follow", "--json"))[:-1]
        d.stop(sig=signal.SIGKILL)
        d.start()
        after = _lines(d.agentctl("tail", cid, "--no-follow", "--json"))[:-1]
        assert after[:len(before)] == before
        assert [x["seq"] for x in after] == list(range(1, len(after) + 1))
        texts = [e["item"]["text"] for e in _json(d.agentctl("history", cid, "--json"))["items"]
                 if e["item"]["kind"] == "user"]
        assert texts == ["hello there", "once more"]
    finally:
        d.stop()


def _start_fails(tmp_path: Path, dsn: str) -> tuple[int, str]:
    d = Daemon(tmp_path, f'[store]\nbackend = "postgres"\ndsn = "{dsn}"\n')
    try:
        d.start(timeout=30)
    except RuntimeError:
        assert d.proc is not None
        return d.proc.returncode, d.log.read_text()
    d.stop()
    raise AssertionError("agentd started on a DSN it cannot use")


def test_a_wrong_password_exits_78_naming_the_host_and_never_the_password(tmp_path: Path, pg_db: PgDatabase) -> None:
    role = f"r_{pg_db.name}"  # roles are the cluster's, shared by the worker's tests
    pg_db.cluster.create_role(role, "right-one", database=pg_db.name)
    code, log = _start_fails(tmp_path, pg_db.cluster.tcp_dsn(pg_db.name, user=role, password="wr0ng-s3cret"))
    assert code == 78, log
    assert "127.0.0.1" in log and "password authentication failed" in log and "restart cannot fix" in log
    assert "wr0ng-s3cret" not in log


def test_an_unreachable_database_exits_1_so_the_unit_restarts_it(tmp_path: Path, pg_db: PgDatabase) -> None:
    code, log = _start_fails(tmp_path, "postgresql://agentd:pw-in-dsn@127.0.0.1:1/agentd")
    assert code == 1, log
    assert "127.0.0.1" in log and "port 1" in log and "pw-in-dsn" not in log
