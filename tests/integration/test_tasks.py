"""Tasks through the real daemon and the real agentctl: queueing, limits, input, cancel, callbacks, restart.

Each test starts its own agentd (``python -m agentd run`` on a temp socket and
state dir, see ``daemon_harness``) with the ``[tasks]`` settings it needs, and
drives it with ``agentctl task ...`` processes, as a script would. Callbacks go
to a small HTTP server on 127.0.0.1 in a thread of the test.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Daemon

from .conftest import SCRIPTS

TASK_SCRIPT = str(SCRIPTS / "task.toml")
#: Short callback backoff, so retries happen within a test.
FAST_CALLBACKS = "callback_backoff_initial_s = 0.1\ncallback_backoff_max_s = 0.4\n"


# ---------------------------------------------------------------------- helpers


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """start(tasks_toml) -> a running Daemon with that [tasks] section; stopped after the test."""
    started: list[Daemon] = []

    def _start(tasks: str = "") -> Daemon:
        root = tmp_path / f"agentd{len(started)}"
        root.mkdir()
        d = Daemon(root, config_text=f"[tasks]\n{tasks}")
        started.append(d)
        return d.start()

    yield _start
    for d in started:
        if d.proc is not None:
            d.stop()


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def create(d: Daemon, workdir: Path, text: str, *extra: str) -> str:
    cp = d.agentctl("task", "create", "-p", "script", "-m", TASK_SCRIPT, "--cwd", str(workdir), text, "--json", *extra)
    rec = one_json(cp)
    assert rec["status"] == "pending"
    return rec["id"]


def show(d: Daemon, task: str) -> dict[str, Any]:
    return one_json(d.agentctl("task", "show", task, "--json"))


def wait_status(d: Daemon, task: str, *statuses: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = show(d, task)
        if info["task"]["status"] in statuses:
            return info
        assert time.monotonic() < deadline, f"task {task} stayed {info['task']['status']}, wanted {statuses}"
        time.sleep(0.05)


def wait_turn(d: Daemon, task: str, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until the running task's turn was sent: status ``running`` comes before it."""
    deadline = time.monotonic() + timeout
    while True:
        info = show(d, task)
        if info["task"]["status"] == "running" and info["task"]["run"]:
            return info
        assert time.monotonic() < deadline, f"task {task} has no turn running: {info['task']}"
        time.sleep(0.05)


def received_prompts(d: Daemon) -> list[str]:
    """Every prompt the script provider ever got (fsynced before it is accepted)."""
    path = d.state_dir / "providers" / "script" / "received.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def task_events(d: Daemon, conversation: str) -> list[dict[str, Any]]:
    return [r["data"] for r in d.journal(conversation) if r["type"] == "task"]


class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers ``codes`` in turn, then 200."""

    def __init__(self, codes: tuple[int, ...] = ()) -> None:
        self.posts: list[tuple[float, dict[str, str], Any]] = []
        self.codes = list(codes)
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with outer.lock:
                    outer.posts.append((time.monotonic(), dict(self.headers), json.loads(body)))
                    code = outer.codes.pop(0) if outer.codes else 200
                self.send_response(code)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def bodies(self) -> list[Any]:
        with self.lock:
            return [body for _, _, body in self.posts]

    def wait(self, count: int, timeout: float = 20.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.bodies()) < count:
            assert time.monotonic() < deadline, f"{len(self.bodies())} POSTs, wanted {count}"
            time.sleep(0.02)
        return self.bodies()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Any]:
    made: list[Receiver] = []

    def _make(codes: tuple[int, ...] = ()) -> Receiver:
        r = Receiver(codes)
        made.append(r)
        return r

    yield _make
    for r in made:
        r.close()


# ---------------------------------------------------------------------- running


def test_task_runs_in_a_new_conversation_and_completes_with_its_last_assistant_message(
    start: Any, workdir: Path
) -> None:
    d = start()
    task = create(d, workdir, "tidy the shelf")
    done = d.agentctl("task", "wait", task, "--timeout", "20")
    assert done.returncode == 0, done.stderr
    t = show(d, task)["task"]
    assert t["status"] == "completed"
    assert t["result"] == "Done: tidy the shelf"  # the last assistant item, not "Working on: ..."
    assert t["error"] == "" and t["run"]
    usage = t["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cached_tokens"]) == (120, 30, 20)
    assert usage["cost_usd"] == pytest.approx(0.0015)
    assert t["created_at"] <= t["started_at"] < t["ended_at"]
    # Its own conversation, interactive, holding the task's prompt and its events.
    conv = one_json(d.agentctl("show", t["conversation"], "--json"))["record"]
    assert conv["mode"] == "interactive" and conv["workdir"] == str(workdir)
    events = task_events(d, t["conversation"])
    assert [(e["event"], e.get("status")) for e in events] == [
        ("created", "pending"), ("started", "running"), ("status", "completed"),
    ]
    assert received_prompts(d) == ["tidy the shelf"]
    listed = one_json(d.agentctl("task", "ls", "--json"))["tasks"]
    assert [(x["id"], x["status"]) for x in listed] == [(task, "completed")]
    assert one_json(d.agentctl("task", "ls", "--status", "pending", "--json"))["tasks"] == []


def test_the_task_list_cuts_each_tasks_long_texts_and_show_gives_them_whole(start: Any, workdir: Path) -> None:
    # Five tasks of 7 MiB prompts made a task list no client could read (73 MB in one reply).
    d = start()
    text = "count " + "the stars " * 300
    task = create(d, workdir, text)
    wait_status(d, task, "completed")
    (listed,) = one_json(d.agentctl("task", "ls", "--json"))["tasks"]
    assert listed["input"] == text[:1000] + "…"
    assert show(d, task)["task"]["input"] == text


def test_human_task_create_prints_only_the_id_and_show_reads_well(start: Any, workdir: Path) -> None:
    d = start()
    cp = d.agentctl("task", "create", "-p", "script", "-m", TASK_SCRIPT, "--cwd", str(workdir), "sort the mail")
    assert cp.returncode == 0, cp.stderr
    task = cp.stdout.strip()
    assert task.startswith("t") and len(task.split()) == 1
    wait_status(d, task, "completed")
    text = d.agentctl("task", "show", task[:5]).stdout  # a unique prefix names it
    assert "status:       completed" in text
    assert "Done: sort the mail" in text
    assert d.agentctl("task", "show", "tnothere").returncode == 6


def test_concurrency_limit_runs_a_providers_tasks_one_after_another_oldest_first(
    start: Any, workdir: Path
) -> None:
    d = start("concurrency = 1\n")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "task", "create", "-p", "script",
             "-m", TASK_SCRIPT, "--cwd", str(workdir), f"job {n}", "--json"],
            env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in range(3)
    ]
    tasks = [json.loads(p.communicate(timeout=30)[0])["id"] for p in procs]
    records = [wait_status(d, t, "completed")["task"] for t in tasks]
    records.sort(key=lambda t: t["created_at"])
    for earlier, later in zip(records, records[1:]):
        # One at a time: the next starts only after the one before it ended, in the order they were queued.
        assert later["started_at"] >= earlier["ended_at"], (earlier, later)
    assert sorted(received_prompts(d)) == ["job 0", "job 1", "job 2"]


def test_limit_is_per_provider_and_a_running_task_leaves_the_others_pending(start: Any, workdir: Path) -> None:
    d = start("concurrency = 5\nprovider_concurrency = { script = 1 }\n")
    first = create(d, workdir, "wait here")
    wait_status(d, first, "running")
    second = create(d, workdir, "second one")
    time.sleep(0.5)
    assert show(d, second)["task"]["status"] == "pending"  # script allows 1, whatever concurrency says
    one_json(d.agentctl("task", "cancel", first, "--json"))
    assert wait_status(d, second, "completed")["task"]["result"] == "Done: second one"


def test_task_waiting_for_input_goes_on_once_answered_with_agentctl_answer(start: Any, workdir: Path) -> None:
    d = start()
    task = create(d, workdir, "ask me something")
    waiting = d.agentctl("task", "wait", task, "--exit-on-action", "--timeout", "20")
    assert waiting.returncode == 4, waiting.stderr
    info = show(d, task)
    assert info["task"]["status"] == "waiting_for_input"
    assert [p["kind"] for p in info["pending"]] == ["question"]
    conv = info["task"]["conversation"]
    human = d.agentctl("task", "show", task).stdout
    assert "waiting for:" in human and "Which colour?" in human

    answered = d.agentctl("answer", conv, "--choice", "red")
    assert answered.returncode == 0, answered.stderr
    done = d.agentctl("task", "wait", task, "--timeout", "20", "--json")
    assert done.returncode == 0, done.stderr
    t = json.loads(done.stdout)
    assert t["status"] == "completed"
    assert t["result"] == "Painted it red."
    statuses = [e["status"] for e in task_events(d, conv) if e["event"] == "status"]
    assert statuses == ["waiting_for_input", "running", "completed"]


def test_failed_turn_fails_the_task_with_its_error(start: Any, workdir: Path) -> None:
    d = start()
    task = create(d, workdir, "fail please")
    done = d.agentctl("task", "wait", task, "--timeout", "20")
    assert done.returncode == 1
    t = show(d, task)["task"]
    assert t["status"] == "failed"
    assert t["error"] == "the script failed on purpose"
    assert t["result"] == "Trying..."


# ---------------------------------------------------------------------- cancel and comment


def test_cancel_dequeues_a_pending_task_and_cancels_a_running_ones_turn(start: Any, workdir: Path) -> None:
    d = start("concurrency = 1\n")
    running = create(d, workdir, "wait for a cancel")
    wait_turn(d, running)
    pending = create(d, workdir, "never run me")

    res = one_json(d.agentctl("task", "cancel", pending, "--json"))
    assert res["disposition"] == "dequeued"
    assert res["task"]["status"] == "cancelled" and res["task"]["conversation"] == ""

    res = one_json(d.agentctl("task", "cancel", running, "--json"))
    assert res["disposition"] == "cancelled"
    t = res["task"]
    assert t["status"] == "cancelled" and t["result"] == "Working on: wait for a cancel"
    turns = [r["data"] for r in d.journal(t["conversation"]) if r["type"] == "turn" and r.get("run") == t["run"]]
    assert turns[-1]["state"] == "cancelled"

    time.sleep(0.5)  # the freed place must not start the cancelled task
    assert show(d, pending)["task"]["status"] == "cancelled"
    assert received_prompts(d) == ["wait for a cancel"]
    again = d.agentctl("task", "cancel", pending)
    assert again.returncode == 8 and "already ended" in again.stderr


def test_a_task_whose_conversation_is_removed_fails_and_one_whose_conversation_is_closed_is_cancelled(
        start: Any, workdir: Path) -> None:
    # The rm cancels the turn before the conversation goes: the task ended "cancelled" with no
    # reason, where docs/tasks.md says failed, conversation_removed; a close left reason "" too.
    d = start()
    removed, closed = create(d, workdir, "wait for a cancel"), create(d, workdir, "wait for a cancel")
    rm_conv, close_conv = wait_turn(d, removed)["task"]["conversation"], wait_turn(d, closed)["task"]["conversation"]
    assert d.agentctl("rm", rm_conv, "--force").returncode == 0
    assert d.agentctl("close", close_conv).returncode == 0
    assert d.agentctl("task", "wait", removed, "--timeout", "20").returncode == 1
    assert d.agentctl("task", "wait", closed, "--timeout", "20").returncode == 3
    t = show(d, removed)["task"]
    assert (t["status"], t["reason"], t["error"]) == ("failed", "conversation_removed", "its conversation was removed")
    t = show(d, closed)["task"]
    assert (t["status"], t["reason"]) == ("cancelled", "cancelled")


def test_comment_steers_a_running_turn_and_is_only_recorded_otherwise(start: Any, workdir: Path) -> None:
    d = start("concurrency = 1\n")
    task = create(d, workdir, "steer me")
    wait_status(d, task, "running")
    queued = create(d, workdir, "later")
    # While the first task holds the only place (it waits for a comment), the second is queued:
    # its comment is recorded only. Once the first ends, the second starts and could be steered.
    human = d.agentctl("task", "comment", queued, "hurry")
    assert human.returncode == 0 and "recorded only" in human.stdout
    res = one_json(d.agentctl("task", "comment", task, "use the blue box", "--json"))
    assert res["comment"]["delivery"] == "steered"
    t = wait_status(d, task, "completed")["task"]
    assert t["result"] == "Comment taken: use the blue box"

    res = one_json(d.agentctl("task", "comment", task, "thanks", "--json"))
    assert res["comment"]["delivery"] == "recorded"
    assert "completed" in res["comment"]["note"]
    t = show(d, task)["task"]
    assert [(c["text"], c["delivery"]) for c in t["comments"]] == [("use the blue box", "steered"),
                                                                    ("thanks", "recorded")]
    comments = [e["comment"]["text"] for e in task_events(d, t["conversation"]) if e["event"] == "comment"]
    assert comments == ["use the blue box", "thanks"]

    # Bounded: the task list carries every comment of every task.
    long = d.agentctl("task", "comment", task, "x" * 16_385)
    assert long.returncode == 1 and "limit: the comment is 16,385 characters" in long.stderr
    with d.client() as client:
        for i in range(254):
            client.request(wire.TaskAddComment, task=task, text=f"note {i}")
        with pytest.raises(c.LimitExceeded, match="256 comments"):
            client.request(wire.TaskAddComment, task=task, text="one more")
    assert len(show(d, task)["task"]["comments"]) == 256


def test_concurrent_comments_on_a_steerable_turn_keep_to_the_bound(start: Any, workdir: Path) -> None:
    # Each steer awaits the turn: comments in flight count against the bound before they are kept.
    # They are sent as soon as the task exists: those that come while its turn is still
    # starting wait for it, and are steered too.
    d = start()
    task = create(d, workdir, "wait for comments")
    counts = {"kept": 0, "limit": 0}
    lock = threading.Lock()

    def comment(n: int) -> None:
        with d.client() as client:
            for i in range(n):
                try:
                    client.request(wire.TaskAddComment, task=task, text="c" * 4000)
                    key = "kept"
                except c.LimitExceeded:
                    key = "limit"
                with lock:
                    counts[key] += 1

    threads = [threading.Thread(target=comment, args=(20,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = show(d, task)["task"]["comments"]
    assert counts == {"kept": 256, "limit": 64} and len(kept) == 256
    assert len({cm["id"] for cm in kept}) == 256
    assert {cm["delivery"] for cm in kept} == {"steered"}
    assert d.agentctl("task", "cancel", task).returncode == 0


# ---------------------------------------------------------------------- callbacks


def test_callback_gets_one_post_per_terminal_status_with_the_tasks_summary(
    start: Any, workdir: Path, receiver: Any
) -> None:
    d = start(FAST_CALLBACKS)
    r = receiver()
    done = create(d, workdir, "count the stars", "--callback", r.url)
    failed = create(d, workdir, "fail now", "--callback", r.url)
    cancelled = create(d, workdir, "wait forever", "--callback", r.url)
    wait_turn(d, cancelled)
    one_json(d.agentctl("task", "cancel", cancelled, "--json"))
    r.wait(3)
    time.sleep(0.5)  # nothing more comes
    by_task = {b["task"]: b for b in r.bodies()}
    assert len(r.bodies()) == 3 and set(by_task) == {done, failed, cancelled}

    body = by_task[done]
    t = show(d, done)["task"]
    assert body == {
        "task": done, "status": "completed", "result": "Done: count the stars", "conversation": t["conversation"],
        "usage": t["usage"], "error": "", "reason": "", "created_at": t["created_at"], "ended_at": t["ended_at"],
    }
    assert by_task[failed]["status"] == "failed"
    assert by_task[failed]["error"] == "the script failed on purpose"
    assert by_task[cancelled]["status"] == "cancelled"
    headers = {k.lower(): v for k, v in r.posts[0][1].items()}
    assert headers["content-type"] == "application/json"
    assert headers["x-agentd-task"] in by_task

    for task in (done, failed, cancelled):
        t = show(d, task)["task"]
        assert t["callback_state"] == "delivered"
        assert [(a["attempt"], a["status_code"], a["ok"]) for a in t["callback_attempts"]] == [(1, 200, True)]
        journaled = [e for e in task_events(d, t["conversation"]) if e["event"] == "callback"]
        assert [e["attempt"]["status_code"] for e in journaled] == [200]


def test_failing_callback_is_retried_with_backoff_and_every_attempt_is_recorded(
    start: Any, workdir: Path, receiver: Any
) -> None:
    d = start(FAST_CALLBACKS)
    r = receiver((500, 503))
    task = create(d, workdir, "be persistent", "--callback", r.url)
    r.wait(3)
    times = [at for at, _, _ in r.posts]
    assert times[1] - times[0] >= 0.1 and times[2] - times[1] >= 0.2  # the delay doubles
    deadline = time.monotonic() + 10
    while (t := show(d, task)["task"])["callback_state"] != "delivered":
        assert time.monotonic() < deadline, t
        time.sleep(0.05)
    assert t["status"] == "completed"
    assert [(a["attempt"], a["status_code"], a["ok"]) for a in t["callback_attempts"]] == [
        (1, 500, False), (2, 503, False), (3, 200, True),
    ]
    assert "500" in t["callback_attempts"][0]["error"]
    journaled = [e["attempt"] for e in task_events(d, t["conversation"]) if e["event"] == "callback"]
    assert [a["status_code"] for a in journaled] == [500, 503, 200]
    assert len(r.bodies()) == 3 and all(b == r.bodies()[0] for b in r.bodies())  # the same summary each time


def test_a_callback_that_never_succeeds_gives_up_after_the_window_and_never_fails_the_task(
    start: Any, workdir: Path
) -> None:
    d = start(FAST_CALLBACKS + "callback_retry_window_s = 1.5\n")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    task = create(d, workdir, "call nobody", "--callback", f"http://127.0.0.1:{port}/hook")
    deadline = time.monotonic() + 20
    while (t := show(d, task)["task"])["callback_state"] != "failed":
        assert time.monotonic() < deadline, t
        time.sleep(0.05)
    assert t["status"] == "completed" and t["result"] == "Done: call nobody"
    attempts = t["callback_attempts"]
    assert attempts  # how many fit in the window depends on the machine's load
    assert all(a["status_code"] == 0 and not a["ok"] and "Connect" in a["error"] for a in attempts)


class Trickler:
    """An HTTP receiver on 127.0.0.1 that reads the POST, then answers one byte every 0.5 s (~40 s)."""

    ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-slow: " + b"z" * 60 + b"\r\n\r\nok"

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[float] = []
        self.cut: list[float] = []  # when the caller hung up on us
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.accepted.append(time.monotonic())
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            try:
                for i in range(len(self.ANSWER)):
                    conn.sendall(self.ANSWER[i:i + 1])
                    time.sleep(0.5)
            except OSError:
                self.cut.append(time.monotonic())
                return
            # The caller may have closed without our noticing yet: the next write tells.
            try:
                time.sleep(0.2)
                conn.sendall(b"x")
                conn.sendall(b"x")
            except OSError:
                self.cut.append(time.monotonic())

    def close(self) -> None:
        self.listener.close()


def test_a_callback_timeout_is_a_deadline_for_the_whole_attempt_not_per_read(start: Any, workdir: Path) -> None:
    # A receiver trickling its answer a byte every 0.5 s never trips a 1.5 s per-read timeout.
    d = start("callback_timeout_s = 1.5\ncallback_retry_window_s = 0\n")
    trickler = Trickler()
    try:
        task = create(d, workdir, "call a slow one", "--callback", trickler.url)
        deadline = time.monotonic() + 30
        while (t := show(d, task)["task"])["callback_state"] != "failed":
            assert time.monotonic() < deadline, t
            time.sleep(0.05)
        recorded = time.monotonic()
        assert trickler.accepted, "the callback never connected"
        took = recorded - trickler.accepted[0]
        assert took < 1.5 + 2.0, f"the attempt took {took:.1f}s with a 1.5 s deadline"
        [attempt] = t["callback_attempts"]
        assert not attempt["ok"] and attempt["status_code"] == 0 and "timed out" in attempt["error"], attempt
        assert t["status"] == "completed"
        wait_deadline = time.monotonic() + 5
        while not trickler.cut:
            assert time.monotonic() < wait_deadline, "agentd kept the connection to the slow receiver open"
            time.sleep(0.05)
        print(f"callback deadline: a receiver trickling 1 byte / 0.5 s was cut after {took:.2f}s (deadline 1.5 s)")
    finally:
        trickler.close()


def test_only_http_and_https_callbacks_are_accepted(start: Any, workdir: Path) -> None:
    d = start()
    for url in ("ftp://127.0.0.1/hook", "file:///etc/passwd", "127.0.0.1:8080/hook", "http://"):
        cp = d.agentctl("task", "create", "-p", "script", "-m", TASK_SCRIPT, "--cwd", str(workdir), "x",
                        "--callback", url)
        assert cp.returncode == 8, (url, cp.stderr)
        assert cp.stdout == "" and "invalid" in cp.stderr and "http(s)" in cp.stderr
    assert one_json(d.agentctl("task", "ls", "--json"))["tasks"] == []


def test_a_task_of_a_model_the_provider_does_not_have_is_refused_before_it_is_queued(start: Any, workdir: Path) -> None:
    # It was queued (exit 0) and failed later, unattended, where `new` refuses it at once.
    d = start()
    missing = str(workdir / "no-such-script.toml")
    new = d.agentctl("new", "-p", "script", "-m", missing, "--cwd", str(workdir))
    task = d.agentctl("task", "create", "-p", "script", "-m", missing, "--cwd", str(workdir), "x")
    assert new.returncode == task.returncode == 8, (new.stderr, task.stderr)
    assert task.stdout == "" and "no-such-script.toml" in task.stderr
    assert one_json(d.agentctl("task", "ls", "--json"))["tasks"] == []


# ---------------------------------------------------------------------- restart


def test_restart_runs_pending_tasks_and_fails_running_ones_without_running_them_again(
    start: Any, workdir: Path, receiver: Any
) -> None:
    d = start("concurrency = 1\n" + FAST_CALLBACKS)
    r = receiver()
    running = create(d, workdir, "wait through a crash", "--callback", r.url)
    wait_turn(d, running)
    pending = create(d, workdir, "run after the crash")
    time.sleep(0.3)
    assert show(d, pending)["task"]["status"] == "pending"
    d.kill()
    assert received_prompts(d) == ["wait through a crash"]

    d.start()
    t = wait_status(d, running, "failed")["task"]
    assert t["reason"] == "run_interrupted"
    assert "not resent" in t["error"]
    turns = [x["data"] for x in d.journal(t["conversation"]) if x["type"] == "turn" and x.get("run") == t["run"]]
    assert turns[-1]["reason"] == "run_interrupted"
    assert task_events(d, t["conversation"])[-1]["status"] == "failed"
    body = r.wait(1)[0]
    assert (body["task"], body["status"], body["reason"]) == (running, "failed", "run_interrupted")

    assert wait_status(d, pending, "completed")["task"]["result"] == "Done: run after the crash"
    time.sleep(0.3)
    # Each prompt reached the provider once: the interrupted task was never run again.
    assert received_prompts(d) == ["wait through a crash", "run after the crash"]
    assert show(d, running)["task"]["status"] == "failed"


def test_task_ls_pages_with_limit_and_after_and_fetches_every_page_without(start: Any, workdir: Path) -> None:
    d = start("concurrency = 1\n")
    ids = [create(d, workdir, f"job {n}") for n in range(5)]
    first = d.agentctl("task", "ls", "--limit", "2", "--json")
    page = one_json(first)
    assert [t["id"] for t in page["tasks"]] == ids[:2] and page["next"] == ids[1]
    assert f"--after {ids[1]}" in first.stderr
    rest = one_json(d.agentctl("task", "ls", "--limit", "10", "--after", page["next"], "--json"))
    assert [t["id"] for t in rest["tasks"]] == ids[2:] and not rest.get("next")
    assert [t["id"] for t in one_json(d.agentctl("task", "ls", "--json"))["tasks"]] == ids
    unknown = d.agentctl("task", "ls", "--after", "tnope")
    assert unknown.returncode == 6, unknown.stderr
