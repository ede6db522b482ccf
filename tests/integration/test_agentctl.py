"""agentctl against the real daemon: every command's --json output and exit code.

agentd runs as ``python -m agentd run`` on a temp socket and state dir (see
``daemon_harness``); agentctl runs as a subprocess, as a user or a script
would run it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

from daemon_harness import REPO, Daemon, drive_pty

SCRIPTS = REPO / "conf" / "scripts"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One real agentd for this module (conversations are told apart by id or title)."""
    d = Daemon(tmp_path_factory.mktemp("agentd")).start()
    try:
        yield d
    finally:
        d.stop()


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    """stdout holds exactly one JSON value and nothing else."""
    return json.loads(cp.stdout)


def json_lines(cp: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    lines = cp.stdout.splitlines()
    assert lines, cp.stderr
    return [json.loads(line) for line in lines]


def new_conversation(daemon: Daemon, workdir: Path, script: str, *extra: str) -> str:
    cp = daemon.agentctl("new", "-p", "script", "-m", str(SCRIPTS / script), "--cwd", str(workdir), "--json", *extra)
    assert cp.returncode == 0, cp.stderr
    return one_json(cp)["id"]


def wait_for_state(daemon: Daemon, conv: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = one_json(daemon.agentctl("show", conv, "--json"))
        if info["record"]["state"] in states:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"{conv} stayed {info['record']['state']}, wanted {states}")
        time.sleep(0.05)


def conversation_titled(daemon: Daemon, title: str, *states: str, timeout: float = 15.0) -> str:
    """The id of the conversation with ``title``, once it is in one of ``states`` (any if none)."""
    deadline = time.monotonic() + timeout
    while True:
        for conv in one_json(daemon.agentctl("ls", "--json"))["conversations"]:
            if conv["title"] == title and (not states or conv["state"] in states):
                return conv["id"]
        assert time.monotonic() < deadline, f"no conversation {title!r} in {states}"
        time.sleep(0.05)


def spawn_agentctl(daemon: Daemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), *args],
        env=daemon.env, cwd=daemon.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


# ---------------------------------------------------------------------- daemon-level commands


def test_status_providers_and_ls_print_one_json_object_each(daemon: Daemon) -> None:
    status = daemon.agentctl("status", "--json")
    assert status.returncode == 0, status.stderr
    body = one_json(status)
    assert body["pid"] == daemon.proc.pid
    assert body["protocol"] == 1
    assert "script" in body["providers"]

    providers = daemon.agentctl("providers", "--json")
    assert providers.returncode == 0
    by_name = {p["name"]: p for p in one_json(providers)["providers"]}
    assert by_name["script"]["available"] is True
    assert by_name["script"]["capabilities"]["cancel"] is True

    ls = daemon.agentctl("ls", "--json")
    assert ls.returncode == 0
    assert isinstance(one_json(ls)["conversations"], list)


def test_status_counts_open_conversations_as_ls_does_and_the_closed_apart(daemon: Daemon, workdir: Path) -> None:
    before = one_json(daemon.agentctl("status", "--json"))
    listed = len(one_json(daemon.agentctl("ls", "--json"))["conversations"])
    assert before["conversations"] == listed
    kept, closing = (new_conversation(daemon, workdir, "echo.toml") for _ in range(2))
    done = daemon.agentctl("close", closing[:9])
    assert done.returncode == 0 and done.stdout == f"closed {closing}\n"  # the full id, not the prefix typed
    after = one_json(daemon.agentctl("status", "--json"))
    assert after["conversations"] == before["conversations"] + 1 == len(
        one_json(daemon.agentctl("ls", "--json"))["conversations"])
    assert after.get("closed", 0) == before.get("closed", 0) + 1
    human = daemon.agentctl("status").stdout
    assert f"conversations: {after['conversations']} open ({after['running']} running), " \
           f"{after['closed']} closed (agentctl ls --all)" in human
    assert daemon.agentctl("close", kept).returncode == 0


def test_global_options_work_before_the_command_too(daemon: Daemon) -> None:
    cp = daemon.agentctl("--json", "status")
    assert cp.returncode == 0 and one_json(cp)["pid"] == daemon.proc.pid


def test_models_of_a_provider_without_a_model_list_is_an_error_on_stderr(daemon: Daemon) -> None:
    cp = daemon.agentctl("models", "script", "--json")
    assert cp.returncode == 1
    assert cp.stdout == ""
    assert "unsupported" in cp.stderr


# ---------------------------------------------------------------------- conversations and turns


def test_new_ls_show_title_close_rm_round_trip(daemon: Daemon, workdir: Path) -> None:
    conv = new_conversation(daemon, workdir, "echo.toml", "--title", "first")
    listed = one_json(daemon.agentctl("ls", "--json"))["conversations"]
    assert [(c["title"], c["state"]) for c in listed if c["id"] == conv] == [("first", "idle")]

    show = daemon.agentctl("show", conv[:6], "--json")  # a unique prefix names it
    assert show.returncode == 0
    info = one_json(show)
    assert info["record"]["workdir"] == str(workdir)
    assert info["pending"] == []

    assert one_json(daemon.agentctl("title", conv, "renamed", "--json"))["ok"] is True
    assert one_json(daemon.agentctl("show", conv, "--json"))["record"]["title"] == "renamed"
    again = daemon.agentctl("title", conv, "renamed")
    assert again.returncode == 0 and again.stdout == f"title of {conv}: renamed\n"
    assert [r["data"] for r in daemon.journal(conv) if r["type"] == "title"].count("renamed") == 1  # once

    assert daemon.agentctl("close", conv, "--json").returncode == 0
    assert conv not in [c["id"] for c in one_json(daemon.agentctl("ls", "--json"))["conversations"]]
    journaled = len(daemon.journal(conv))
    again = daemon.agentctl("close", conv[:6])  # closed already: says so as before, journals nothing more
    assert again.returncode == 0 and again.stdout == f"closed {conv}\n", again.stderr
    assert len(daemon.journal(conv)) == journaled
    every = one_json(daemon.agentctl("ls", "--all", "--json"))["conversations"]
    assert [c["state"] for c in every if c["id"] == conv] == ["closed"]

    assert daemon.agentctl("rm", conv, "--json").returncode == 0
    assert daemon.agentctl("show", conv, "--json").returncode == 6


def test_a_prompt_read_from_stdin_loses_the_line_end_after_its_last_line(daemon: Daemon, workdir: Path) -> None:
    # `echo hi | agentctl send C -` sent "hi\n": the agent saw a stray newline.
    conv = new_conversation(daemon, workdir, "echo.toml")
    sent = daemon.agentctl("send", conv, "-", "--follow", input="two lines\nof text\n\n")
    assert sent.returncode == 0, sent.stderr
    assert [r["data"]["text"] for r in daemon.journal(conv) if r["type"] == "prompt"] == ["two lines\nof text"]


def test_human_new_prints_only_the_id(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("new", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(workdir))
    assert cp.returncode == 0
    conv = cp.stdout.strip()
    assert one_json(daemon.agentctl("show", conv, "--json"))["record"]["id"] == conv


def test_run_of_a_completing_script_streams_json_lines_and_exits_0(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(workdir),
                         "hello there", "--json")
    assert cp.returncode == 0, cp.stderr
    lines = json_lines(cp)
    result = lines[-1]
    assert result["type"] == "result" and result["state"] == "completed" and result["exit_code"] == 0
    records = [x for x in lines[:-1] if x["type"] != "snapshot"]
    assert all(x["conversation"] == result["conversation"] for x in lines)
    # Subscribed before the send, so everything the send caused streams live: the title taken
    # from the prompt, then the run's own records, the prompt first.
    run_records = [x for x in records if x.get("run") == result["run"]]
    assert run_records[0]["type"] == "prompt" and run_records[0]["data"]["text"] == "hello there"
    assert any(x["type"] == "delta" for x in run_records), "the streamed text reaches the follower"
    assert records[-1]["type"] == "turn" and records[-1]["run"] == result["run"]
    durable = [x["seq"] for x in records if x["seq"]]
    assert durable == sorted(set(durable)), "each journal record exactly once, in order"
    text = "".join(x["data"]["text"] for x in records if x["type"] == "item" and x["data"]["kind"] == "assistant")
    assert "You said: hello there" in text


def test_run_human_output_shows_the_streamed_answer_and_the_outcome(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(workdir), "hi")
    assert cp.returncode == 0
    assert "\x1b" not in cp.stdout  # NO_COLOR and not a terminal
    assert "You said: hi." in cp.stdout
    assert cp.stdout.rstrip().endswith("turn completed")


def test_run_of_a_failing_script_exits_1(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "fail.toml"), "--cwd", str(workdir),
                         "x", "--json")
    assert cp.returncode == 1
    result = json_lines(cp)[-1]
    assert (result["state"], result["exit_code"]) == ("failed", 1)
    assert "fails" in result["error"]


def test_a_cancelled_turn_makes_run_exit_3(daemon: Daemon, workdir: Path) -> None:
    proc = spawn_agentctl(daemon, "run", "-p", "script", "-m", str(SCRIPTS / "wait.toml"), "--cwd", str(workdir),
                          "--title", "to cancel", "wait for me", "--json")
    try:
        conv = conversation_titled(daemon, "to cancel", "running")
        cancel = daemon.agentctl("cancel", conv, "--json")
        assert cancel.returncode == 0 and one_json(cancel)["ok"] is True
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert json.loads(out.splitlines()[-1])["state"] == "cancelled"


def test_send_answers_with_the_run_and_follow_exits_with_the_outcome(daemon: Daemon, workdir: Path) -> None:
    conv = new_conversation(daemon, workdir, "cycle.toml")
    sent = daemon.agentctl("send", conv, "first", "--json")
    assert sent.returncode == 0
    body = one_json(sent)
    assert body["disposition"] == "started" and body["run"]
    wait_for_state(daemon, conv, "idle")
    followed = daemon.agentctl("send", conv, "hello", "--follow", "--json")
    assert followed.returncode == 0
    lines = json_lines(followed)
    assert lines[-1]["state"] == "completed"
    assert any(x["type"] == "item" and x["data"].get("text") == "Hello to you too." for x in lines)


def test_send_while_busy_exits_7_and_queue_is_accepted(daemon: Daemon, workdir: Path) -> None:
    conv = new_conversation(daemon, workdir, "wait.toml")
    assert daemon.agentctl("send", conv, "one").returncode == 0
    busy = daemon.agentctl("send", conv, "two", "--json")
    assert busy.returncode == 7
    assert busy.stdout == "" and "busy" in busy.stderr
    queued = daemon.agentctl("send", conv, "two", "--if-busy", "queue", "--json")
    assert queued.returncode == 0 and one_json(queued)["disposition"] == "queued"
    assert daemon.agentctl("cancel", conv).returncode == 0


def test_steer_joins_the_running_turn(daemon: Daemon, workdir: Path) -> None:
    conv = new_conversation(daemon, workdir, "wait.toml")
    follower = spawn_agentctl(daemon, "send", conv, "please steer", "--follow", "--json")
    try:
        wait_for_state(daemon, conv, "running")
        steer = daemon.agentctl("steer", conv, "go left", "--json")
        assert steer.returncode == 0 and one_json(steer)["disposition"] == "steered"
        out, err = follower.communicate(timeout=15)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    texts = [json.loads(x)["data"].get("text", "") for x in out.splitlines() if '"item"' in x]
    assert "Steered: go left" in texts


def test_unknown_conversations_exit_6(daemon: Daemon) -> None:
    for args in (["show", "nope"], ["send", "nope", "hi"], ["cancel", "nope"], ["tail", "nope", "--no-follow"],
                 ["answer", "nope", "--allow"], ["rm", "nope"]):
        cp = daemon.agentctl(*args, "--json")
        assert cp.returncode == 6, (args, cp.stderr)
        assert cp.stdout == ""
        assert "not_found" in cp.stderr


def test_tail_no_follow_prints_the_journal_then_a_snapshot(daemon: Daemon, workdir: Path) -> None:
    run = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "echo.toml"), "--cwd", str(workdir), "x", "--json")
    conv = json_lines(run)[-1]["conversation"]
    cp = daemon.agentctl("tail", conv, "--no-follow", "--json")
    assert cp.returncode == 0
    lines = json_lines(cp)
    assert [x["seq"] for x in lines[:-1]] == list(range(1, len(lines)))
    assert lines[0]["type"] == "conversation"
    assert lines[-1]["type"] == "snapshot" and lines[-1]["data"]["state"] == "idle"
    later = json_lines(daemon.agentctl("tail", conv, "--after", "3", "--no-follow", "--json"))
    assert later[0]["seq"] == 4


def test_tail_after_a_seq_inside_the_turn_in_flight_shows_nothing_from_before_it(daemon: Daemon, workdir: Path,
                                                                               tmp_path: Path) -> None:
    script = tmp_path / "midway.toml"
    script.write_text(
        'model = "midway"\ndelay_ms = 0\n[[turn]]\n'
        '[[turn.step]]\nkind = "reasoning"\ntext = "Pondering first."\n'
        '[[turn.step]]\nkind = "text"\ntext = "First part of the answer."\n'
        '[[turn.step]]\nkind = "title"\ntitle = "midway"\n'
        '[[turn.step]]\nkind = "text"\ntext = "Second part."\n'
        '[[turn.step]]\nkind = "wait"\n'
    )
    conv = new_conversation(daemon, workdir, str(script))
    assert daemon.agentctl("send", conv, "go").returncode == 0
    deadline = time.monotonic() + 15
    while True:
        lines = json_lines(daemon.agentctl("tail", conv, "--no-follow", "--json"))
        texts = {x["data"].get("text"): x["seq"] for x in lines if x["type"] == "item"}
        if "Second part." in texts:
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    snapshot = lines[-1]["data"]
    assert snapshot["state"] == "running"
    assert {i["text"] for i in snapshot["items"]} >= {"Pondering first.", "First part of the answer."}
    first = texts["First part of the answer."]
    try:
        # after the first text: neither it nor the reasoning before it shows again
        after = daemon.agentctl("tail", conv, "--no-follow", "--after", str(first))
        assert after.returncode == 0, after.stderr
        assert "title: midway" in after.stdout and after.stdout.count("Second part.") == 1
        assert "Pondering" not in after.stdout and "First part" not in after.stdout, after.stdout
        # just before it: the replay shows it, once
        before = daemon.agentctl("tail", conv, "--no-follow", "--after", str(first - 1))
        assert before.stdout.count("First part of the answer.") == 1 and "Pondering" not in before.stdout
        # from the start: everything, once
        whole = daemon.agentctl("tail", conv, "--no-follow")
        assert whole.stdout.count("Pondering first.") == 1 and whole.stdout.count("First part") == 1
        # --seq shows where each record is, as --after takes it
        marked = daemon.agentctl("tail", conv, "--no-follow", "--seq")
        assert f"#{first} First part of the answer." in marked.stdout.splitlines()
        assert f"tail --after {lines[-2]['seq']} " in daemon.agentctl("show", conv).stdout
    finally:
        daemon.agentctl("cancel", conv)


def test_cancel_says_when_no_turn_is_running(daemon: Daemon, workdir: Path) -> None:
    conv = new_conversation(daemon, workdir, "wait.toml")
    idle = daemon.agentctl("cancel", conv)
    assert idle.returncode == 0
    assert idle.stdout == f"nothing to cancel: no turn is running in {conv}\n"
    assert one_json(daemon.agentctl("cancel", conv, "--json"))["cancelled"] is False
    run = one_json(daemon.agentctl("send", conv, "wait", "--json"))["run"]
    cancelled = daemon.agentctl("cancel", conv, "--json")
    assert cancelled.returncode == 0
    assert one_json(cancelled) == {"ok": True, "conversation": conv, "cancelled": True, "run": run,
                                   "state": "cancelled", "reason": "", "inferred": False}
    wait_for_state(daemon, conv, "idle")


def test_send_follow_shows_the_files_attached_to_the_prompt(daemon: Daemon, workdir: Path, tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("error: it broke\n")
    conv = new_conversation(daemon, workdir, "echo.toml")
    cp = daemon.agentctl("send", conv, "what is wrong here?", "--attach", str(log), "--follow")
    assert cp.returncode == 0, cp.stderr
    assert "› what is wrong here?  [attached: build.log]" in cp.stdout.splitlines()


def test_answer_choice_by_number_picks_that_choice(daemon: Daemon, workdir: Path, tmp_path: Path) -> None:
    script = tmp_path / "colour.toml"
    script.write_text(
        'model = "colour"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "question"\ntitle = "Pick a colour"\n'
        'text = "Which colour?"\nchoices = ["red", "green", "blue"]\ncustom = true\necho = "{answer} it is."\n'
    )
    conv = new_conversation(daemon, workdir, str(script))
    assert daemon.agentctl("send", conv, "go").returncode == 0
    wait_for_state(daemon, conv, "requires_action")
    out_of_range = daemon.agentctl("answer", conv, "--choice", "4")
    assert out_of_range.returncode == 8
    assert "1) red, 2) green, 3) blue" in out_of_range.stderr
    ok = daemon.agentctl("answer", conv, "--choice", "2")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.endswith(": green\n") and ok.stdout.startswith("answered ")
    wait_for_state(daemon, conv, "idle")
    lines = json_lines(daemon.agentctl("tail", conv, "--no-follow", "--json"))
    assert any(x["type"] == "item" and x["data"].get("text") == "green it is." for x in lines)


def test_a_missing_provider_points_at_agentctl_providers(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("new", "-p", "foo", "--cwd", str(workdir))
    assert cp.returncode == 6
    assert "no provider 'foo'" in cp.stderr and "(agentctl providers lists them)" in cp.stderr


# ---------------------------------------------------------------------- interactions


def test_a_pending_permission_exits_4_then_answers_are_checked(daemon: Daemon, workdir: Path) -> None:
    run = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(workdir), "go",
                          "--exit-on-action", "--json")
    assert run.returncode == 4, run.stderr
    result = json_lines(run)[-1]
    assert result["state"] == "requires_action"
    conv, inter = result["conversation"], result["interaction"]
    assert inter["kind"] == "permission"

    bad = daemon.agentctl("answer", conv, "--option", "bogus", "--json")
    assert bad.returncode == 8 and bad.stdout == ""
    wrong_kind = daemon.agentctl("answer", conv, "--choice", "red", "--json")
    assert wrong_kind.returncode == 8
    missing = daemon.agentctl("answer", conv, inter["id"] + "-nope", "--allow", "--json")
    assert missing.returncode == 6

    ok = daemon.agentctl("answer", conv, "--allow", "--json")
    assert ok.returncode == 0, ok.stderr
    assert one_json(ok)["interaction"] == inter["id"]
    wait_for_state(daemon, conv, "idle")
    assert (workdir / "agentd-tool.txt").read_text() == "written by agentd\n"
    again = daemon.agentctl("answer", conv, "--allow", "--json")
    assert again.returncode == 6  # nothing pending any more


def test_tail_gives_answer_hints_only_while_the_interaction_is_pending(daemon: Daemon, workdir: Path) -> None:
    run = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(workdir), "go",
                          "--exit-on-action", "--json")
    assert run.returncode == 4, run.stderr
    conv = json_lines(run)[-1]["conversation"]
    pending = daemon.agentctl("tail", conv, "--no-follow")
    assert pending.returncode == 0, pending.stderr
    assert pending.stdout.count("answer with: ") == 1
    assert "1-1-permission --allow" in pending.stdout.rstrip().splitlines()[-3]  # at the end of the output

    assert daemon.agentctl("answer", conv, "--allow").returncode == 0
    wait_for_state(daemon, conv, "idle")
    answered = daemon.agentctl("tail", conv, "--no-follow")
    assert answered.returncode == 0, answered.stderr
    assert "answered 1-1-permission (Allow bash?): Allow once" in answered.stdout
    assert "answer with" not in answered.stdout


def test_a_follower_without_a_terminal_prints_how_to_answer_and_keeps_following(daemon: Daemon, workdir: Path) -> None:
    proc = spawn_agentctl(daemon, "run", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(workdir),
                          "--title", "watched", "go")
    try:
        conv = conversation_titled(daemon, "watched", "requires_action")
        assert daemon.agentctl("answer", conv, "--deny").returncode == 0
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"answer with: agentctl --socket {daemon.socket} answer {conv} 1-1-permission --allow" in out
    assert "failed: denied" in out or "failed" in out
    assert out.rstrip().endswith("turn completed")


def test_yolo_runs_to_the_end_without_asking(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(workdir), "go",
                         "--yolo", "--exit-on-action")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "answered 1-1-permission (Allow bash?): Allow once (yolo)" in cp.stdout
    assert "answer with" not in cp.stdout


def test_run_at_a_terminal_asks_for_the_permission_and_goes_on(daemon: Daemon, workdir: Path) -> None:
    code, out = drive_pty(
        [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "run", "-p", "script",
         "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(workdir), "go"],
        daemon.env, daemon.root, [("choose 1-3:", "7"), ("choose 1-3:", "1")],
    )
    assert code == 0, out
    assert "type a number from 1 to 3" in out
    assert "answer with" not in out  # asked, not told
    assert (workdir / "agentd-tool.txt").exists()


def test_attach_at_a_terminal_fills_a_form_and_reviews_a_plan(daemon: Daemon, workdir: Path) -> None:
    run = spawn_agentctl(daemon, "run", "-p", "script", "-m", str(REPO / "conf" / "demo.toml"), "--cwd",
                         str(workdir), "tour", "--json")
    try:
        assert run.stdout is not None
        run_conv = json.loads(run.stdout.readline())["conversation"]  # every JSON line names it
        wait_for_state(daemon, run_conv, "requires_action")
        code, out = drive_pty(
            [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "attach", run_conv, "--until-idle"],
            daemon.env, daemon.root,
            [("choose 1-3:", "1"), ("[1-3, or type an answer]:", "2"),
             ("name (", "Ann"), ("email (", "not-an-email"), ("email (", ""), ("lines (", "5"),
             ("verbose (", "n"), ("topics (", "1"), ("or f to give feedback", "f"), ("feedback:", "shorter")],
            timeout=30,
        )
        rest, _ = run.communicate(timeout=30)
        out_run = rest
    finally:
        run.kill()
    assert "must be a valid email" in out
    assert code == 0, out
    assert run.returncode == 0, out
    result = json.loads(out_run.splitlines()[-1])
    assert result["state"] == "completed"
    answers = [json.loads(x)["data"] for x in out_run.splitlines() if '"type":"answer"' in x]
    assert [a["answer"].get("decision") for a in answers[:1]] == ["allow_once"]
    assert answers[1]["answer"]["answers"] == [["green"]]
    assert answers[2]["answer"]["answers"] == [["Ann"], [], ["5"], ["no"], ["Tools"]]
    assert answers[3]["answer"]["plan"] == {"feedback": "shorter"}


# ---------------------------------------------------------------------- reaching the daemon


def test_an_unreachable_daemon_exits_5_without_autostart(tmp_path: Path) -> None:
    env = dict(os.environ, AGENTD_SOCKET=str(tmp_path / "none.sock"), AGENTD_STATE_DIR=str(tmp_path / "state"))
    env.pop("AGENTD_NO_AUTOSTART", None)
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json", "--no-autostart"],
                        env=env, capture_output=True, text=True, timeout=30, cwd=REPO)
    assert cp.returncode == 5
    assert cp.stdout == ""
    assert "not running" in cp.stderr
    env["AGENTD_NO_AUTOSTART"] = "1"
    cp = subprocess.run([sys.executable, "-m", "agentctl", "ls"], env=env, capture_output=True, text=True,
                        timeout=30, cwd=REPO)
    assert cp.returncode == 5
    assert not (tmp_path / "state").exists(), "nothing was started"


def test_autostart_starts_agentd_once_and_reuses_it(tmp_path: Path) -> None:
    rundir = tmp_path / "run"
    env = dict(
        os.environ,
        AGENTD_SOCKET=str(rundir / "agentd.sock"),
        AGENTD_STATE_DIR=str(tmp_path / "state"),
        AGENTD_RUNTIME_DIR=str(rundir),
        AGENTD_CONFIG=str(tmp_path / "agentd.toml"),
    )
    (tmp_path / "agentd.toml").write_text("")
    env.pop("AGENTD_NO_AUTOSTART", None)
    first = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json"], env=env,
                           capture_output=True, text=True, timeout=30, cwd=tmp_path)
    started = re.search(r"starting agentd \(pid (\d+)\)", first.stderr)
    assert started, first.stderr
    pid = int(started.group(1))
    try:
        assert first.returncode == 0, first.stderr
        assert one_json(first)["pid"] == pid
        assert f"starting agentd (pid {pid}); log: {rundir / 'agentd.log'}" in first.stderr
        assert one_json(first)["socket"] == str(rundir / "agentd.sock")
        second = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json"], env=env,
                                capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert second.returncode == 0
        assert one_json(second)["pid"] == pid
        assert "started" not in second.stderr
        # restart on a running agentd restarts it in place; with none running it says it started one
        again = subprocess.run([sys.executable, "-m", "agentctl", "restart"], env=env,
                               capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert again.returncode == 0 and again.stdout.startswith(f"restarted agentd in place (pid {pid}"), again.stderr
        _terminate(pid)
        fresh = subprocess.run([sys.executable, "-m", "agentctl", "restart"], env=env,
                               capture_output=True, text=True, timeout=30, cwd=tmp_path)
        started = re.search(r"starting agentd \(pid (\d+)\)", fresh.stderr)
        assert started, fresh.stderr
        pid = int(started.group(1))
        assert fresh.returncode == 0 and fresh.stdout.startswith(f"agentd was not running: started it (pid {pid})"), (
            fresh.stdout, fresh.stderr)
        assert "in place" not in fresh.stdout
    finally:
        _terminate(pid)


def test_autostart_quotes_the_error_of_a_daemon_whose_config_is_broken(tmp_path: Path) -> None:
    rundir = tmp_path / "run"
    env = dict(
        os.environ,
        AGENTD_SOCKET=str(rundir / "agentd.sock"),
        AGENTD_STATE_DIR=str(tmp_path / "state"),
        AGENTD_RUNTIME_DIR=str(rundir),
        AGENTD_CONFIG=str(tmp_path / "agentd.toml"),
    )
    env.pop("AGENTD_NO_AUTOSTART", None)
    (tmp_path / "agentd.toml").write_text("[daemon]\nno_such_key = 1\n")
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json"], env=env,
                        capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert cp.returncode == 5
    assert cp.stdout == ""
    log = rundir / "agentd.log"
    err = [json.loads(line) for line in cp.stderr.splitlines() if '"code"' in line][-1]  # --json: one object
    assert err["code"] == "unreachable"
    assert f"agentd exited with status 78 (a start-up error a restart cannot fix) right after starting; its log {log} says:\n" \
           f"  agentd: {tmp_path / 'agentd.toml'}: unknown key daemon.no_such_key" in err["message"]
    # only what this daemon wrote is quoted, not the errors of earlier starts
    (tmp_path / "agentd.toml").write_text("[daemon\n")
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status"], env=env,
                        capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert cp.returncode == 5
    assert "TOML syntax error" in cp.stderr and "no_such_key" not in cp.stderr


def _terminate(pid: int, timeout: float = 20.0) -> None:
    """Stop a detached daemon we did not spawn directly (it is not our child)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return
        if state == "Z":
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_a_burst_of_deltas_is_shown_whole_with_each_record_once(daemon: Daemon, workdir: Path,
                                                                tmp_path: Path) -> None:
    words = " ".join(f"w{i}" for i in range(400))
    script = tmp_path / "burst.toml"
    script.write_text(f'model = "burst"\nchunk = 1\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "text"\n'
                      f'text = "{words} END"\n')
    cp = daemon.agentctl("run", "-p", "script", "-m", str(script), "--cwd", str(workdir), "x", "--json")
    assert cp.returncode == 0, cp.stderr
    lines = json_lines(cp)
    durable = [x["seq"] for x in lines if x["type"] not in ("snapshot", "result") and x["seq"]]
    assert durable == list(range(durable[0], durable[-1] + 1)), "no gap, no duplicate"
    deltas = "".join(x["data"]["text"] for x in lines if x["type"] == "delta")
    final = [x for x in lines if x["type"] == "item" and x["data"]["kind"] == "assistant"][-1]["data"]["text"]
    assert final == f"{words} END"
    assert final.endswith(deltas)  # live text may start late (after the snapshot), never out of order
    human = daemon.agentctl("run", "-p", "script", "-m", str(script), "--cwd", str(workdir), "x")
    assert human.stdout.count(f"{words} END") == 1


def test_an_ambiguous_prefix_says_how_many_more_it_matches(daemon: Daemon, workdir: Path) -> None:
    ids = [new_conversation(daemon, workdir, "echo.toml") for _ in range(7)]
    assert all(cid.startswith("c") for cid in ids)  # every conversation id does
    shown = daemon.agentctl("show", "c")
    matching = len(one_json(daemon.agentctl("ls", "--all", "--json"))["conversations"])
    assert shown.returncode == 8 and f"and {matching - 5} more (type more of the id)" in shown.stderr, shown.stderr
    for cid in ids:
        daemon.agentctl("rm", cid)


def test_attach_until_idle_to_an_idle_conversation_says_there_is_nothing_to_follow(daemon: Daemon, workdir: Path) -> None:
    cid = new_conversation(daemon, workdir, "echo.toml")
    done = daemon.agentctl("attach", cid, "--until-idle", "--no-input")
    assert done.returncode == 0, done.stderr
    assert "idle already: nothing to follow" in done.stdout and "Ctrl-C" not in done.stdout
    # with --after it replays the records after that seq first, and says so
    assert daemon.agentctl("send", cid, "hello", "--follow").returncode == 0
    replay = daemon.agentctl("attach", cid, "--after", "0", "--until-idle", "--no-input")
    assert replay.returncode == 0, replay.stderr
    assert "idle: the records after seq 0, then done" in replay.stdout and "nothing to follow" not in replay.stdout
    assert "hello" in replay.stdout
    # a seq past the journal's end is said to be (it printed nothing, silently)
    past = daemon.agentctl("tail", cid, "--after", "9999", "--no-follow")
    assert past.returncode == 0 and past.stdout == "", past.stdout
    assert "seq 9999 is past the last record of" in past.stderr and "nothing to replay" in past.stderr, past.stderr
    # a negative seq is a usage error before anything is printed, as for history
    for cmd in ("attach", "tail", "history"):
        bad = daemon.agentctl(cmd, cid, "--after", "-1")
        assert bad.returncode == 2 and bad.stdout == "", (cmd, bad.stdout, bad.stderr)
    daemon.agentctl("rm", cid)
