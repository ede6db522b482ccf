"""agentctl's conventions, through the real daemon and the real agentctl: version, completion,
examples in help, a default provider, ls filters, rm of a running turn, full ids, --json errors,
answers that do not fit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from agentd import __version__
from daemon_harness import REPO, Daemon

SCRIPTS = REPO / "conf" / "scripts"
ASK = REPO / "tests" / "integration" / "scripts" / "ask.toml"
DEMO = REPO / "conf" / "demo.toml"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One agentd whose config names a default provider (script)."""
    d = Daemon(tmp_path_factory.mktemp("agentd"), '[providers]\ndefault = "script"\n').start()
    try:
        yield d
    finally:
        d.stop()


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def wait_state(d: Daemon, conv: str, *states: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = one_json(d.agentctl("show", conv, "--json"))
        if info["record"]["state"] in states:
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def test_version_of_agentctl_and_of_the_daemon_in_status(daemon: Daemon) -> None:
    cp = daemon.agentctl("--version")
    assert cp.returncode == 0 and cp.stdout.strip() == f"agentctl, version {__version__}"
    st = one_json(daemon.agentctl("status", "--json"))
    assert st["version"] == __version__ and st["agentctl"] == __version__
    human = daemon.agentctl("status")
    assert human.stdout.startswith(f"agentd {__version__} (protocol ")
    assert "`agentctl providers` says which can run a turn now" in human.stdout  # status does not probe them


def test_run_and_new_without_p_use_the_default_provider(daemon: Daemon, tmp_path: Path) -> None:
    rec = one_json(daemon.agentctl("new", "--cwd", str(tmp_path), "--json"))
    assert rec["provider"] == "script"
    cp = daemon.agentctl("run", "--cwd", str(tmp_path), "-m", str(SCRIPTS / "echo.toml"), "--json", "hi")
    last = json.loads(cp.stdout.splitlines()[-1])
    assert cp.returncode == 0 and last["state"] == "completed", cp.stderr


def test_without_a_default_provider_new_says_to_give_p(tmp_path: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        cp = d.agentctl("new", "--cwd", str(tmp_path), "--json")
        assert cp.returncode == 8 and cp.stdout == ""
        err = json.loads(cp.stderr)
        assert err["code"] == "invalid" and "[providers] default" in err["message"] and "-p" in err["message"]
    finally:
        d.stop()


def test_ls_is_newest_first_and_filters_by_provider_state_and_limit(daemon: Daemon, tmp_path: Path) -> None:
    ids = [one_json(daemon.agentctl("new", "-p", "script", "--cwd", str(tmp_path), "--title", f"ls-{i}", "--json"))["id"]
           for i in range(3)]
    one_json(daemon.agentctl("close", ids[0], "--json"))
    listed = [r["id"] for r in one_json(daemon.agentctl("ls", "--json"))["conversations"]]
    assert ids[0] not in listed
    assert listed.index(ids[2]) < listed.index(ids[1])  # the last updated first
    # a conversation used again comes first, as its UPDATED column says (it was listed by creation)
    assert daemon.agentctl("send", ids[1], "again", "--follow").returncode == 0
    listed = [r["id"] for r in one_json(daemon.agentctl("ls", "--json"))["conversations"]]
    assert listed.index(ids[1]) < listed.index(ids[2])
    top = one_json(daemon.agentctl("ls", "-n", "1", "--json"))["conversations"]
    assert [r["id"] for r in top] == [listed[0]]
    closed = one_json(daemon.agentctl("ls", "--state", "closed", "--json"))["conversations"]
    assert ids[0] in [r["id"] for r in closed] and all(r["state"] == "closed" for r in closed)
    assert one_json(daemon.agentctl("ls", "--provider", "copilot", "--json"))["conversations"] == []
    assert len(one_json(daemon.agentctl("ls", "-p", "script", "--json"))["conversations"]) >= 2
    human = daemon.agentctl("ls", "-n", "2")
    assert human.returncode == 0 and len(human.stdout.splitlines()) == 3  # header + 2


def test_rm_of_a_running_turn_is_refused_without_force(daemon: Daemon, tmp_path: Path) -> None:
    conv = one_json(daemon.agentctl("new", "-m", str(SCRIPTS / "wait.toml"), "--cwd", str(tmp_path), "--json"))["id"]
    one_json(daemon.agentctl("send", conv, "go", "--json"))
    wait_state(daemon, conv, "running")
    cp = daemon.agentctl("rm", conv[:6])
    assert cp.returncode == 7, cp.stderr
    assert "running turn" in cp.stderr and "--force" in cp.stderr and "--if-busy" not in cp.stderr
    assert one_json(daemon.agentctl("show", conv, "--json"))["record"]["state"] == "running"  # nothing lost
    gone = one_json(daemon.agentctl("rm", conv[:6], "--force", "--json"))
    assert gone["conversation"] == conv  # the full id, not the prefix typed
    assert daemon.agentctl("show", conv, "--json").returncode == 6


def test_json_prints_full_ids_for_a_prefix(daemon: Daemon, tmp_path: Path) -> None:
    conv = one_json(daemon.agentctl("new", "--cwd", str(tmp_path), "--json"))["id"]
    assert one_json(daemon.agentctl("title", conv[:7], "named", "--json"))["conversation"] == conv
    assert one_json(daemon.agentctl("close", conv[:7], "--json"))["conversation"] == conv
    assert one_json(daemon.agentctl("rm", conv[:7], "--json"))["conversation"] == conv


def test_an_error_under_json_is_one_object_on_stderr_and_stdout_stays_empty(daemon: Daemon, tmp_path: Path) -> None:
    cases = [
        (("show", "nosuchconv", "--json"), 6, "not_found"),          # the daemon's error
        (("show", "--json"), 2, "usage"),                             # click's usage error
        (("--json", "nosuchcommand"), 2, "usage"),
        (("ls", "--json", "--limit", "0"), 2, "usage"),
        (("answer", "nosuchconv", "--allow", "--json"), 6, "not_found"),
    ]
    for args, code, name in cases:
        cp = daemon.agentctl(*args)
        assert cp.returncode == code, (args, cp.stderr)
        assert cp.stdout == "", (args, cp.stdout)
        lines = cp.stderr.splitlines()
        assert len(lines) == 1, (args, cp.stderr)
        err = json.loads(lines[0])
        assert err["code"] == name and err["exit_code"] == code and err["message"], (args, err)
    # unreachable: no daemon there
    cp = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(tmp_path / "none.sock"), "--no-autostart",
                         "status", "--json"], capture_output=True, text=True, env=daemon.env, timeout=30)
    assert cp.returncode == 5 and cp.stdout == ""
    assert json.loads(cp.stderr)["code"] == "unreachable"
    # and without --json, the human line as before
    human = daemon.agentctl("show", "nosuchconv")
    assert human.returncode == 6 and human.stderr.startswith("agentctl: not_found: no conversation")
    # agentctl's own refusals too: a revert that needs --yes (it was the human line under --json)
    work = tmp_path / "revert"
    work.mkdir()
    conv = one_json(daemon.agentctl("new", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(work), "--yolo", "--json"))["id"]
    assert daemon.agentctl("send", conv, "go", "--follow", "--json").returncode == 0
    assert (work / "agentd-tool.txt").exists()
    cp = daemon.agentctl("--json", "revert", conv, "--run", "1")
    assert cp.returncode == 2 and cp.stdout == "", cp.stderr
    err = json.loads(cp.stderr)
    assert err["code"] == "usage" and err["exit_code"] == 2 and "--yes" in err["message"], err
    assert (work / "agentd-tool.txt").exists()


def test_a_choice_that_is_no_choice_is_refused_even_where_free_text_is_taken(daemon: Daemon, tmp_path: Path) -> None:
    conv = one_json(daemon.agentctl("new", "-m", str(ASK), "--cwd", str(tmp_path), "--json"))["id"]
    one_json(daemon.agentctl("send", conv, "go", "--json"))
    wait_state(daemon, conv, "requires_action")
    one_json(daemon.agentctl("answer", conv, "--allow", "--json"))
    deadline = time.monotonic() + 20
    while True:
        pending = one_json(daemon.agentctl("show", conv, "--json"))["pending"]
        if pending and pending[0]["kind"] == "question":
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cp = daemon.agentctl("answer", conv, "--choice", "bleu")
    assert cp.returncode == 8, cp.stderr
    assert "not one of the choices" in cp.stderr and "1) red, 2) blue" in cp.stderr and '--text "bleu"' in cp.stderr
    assert one_json(daemon.agentctl("show", conv, "--json"))["pending"], "the refused answer reached the agent"
    ok = one_json(daemon.agentctl("answer", conv, "--text", "bleu", "--json"))
    assert ok["answer"]["answers"] == [["bleu"]]
    twice = daemon.agentctl("answer", conv, pending[0]["id"], "--text", "bleu")
    assert twice.returncode == 6 and "answered already, or never asked" in twice.stderr, twice.stderr


def test_an_invalid_plan_action_lists_the_valid_ones(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text(
        'model = "plan"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "plan"\n'
        'content = "1. do it"\nactions = ["autopilot", "interactive"]\n[[turn.step]]\nkind = "text"\ntext = "done"\n'
    )
    conv = one_json(daemon.agentctl("new", "-m", str(tmp_path / "plan.toml"), "--cwd", str(tmp_path), "--json"))["id"]
    one_json(daemon.agentctl("send", conv, "go", "--json"))
    wait_state(daemon, conv, "requires_action")
    cp = daemon.agentctl("answer", conv, "--action", "autopiolt")
    assert cp.returncode == 8, cp.stderr
    assert "autopilot, interactive" in cp.stderr and "--feedback" in cp.stderr
    assert one_json(daemon.agentctl("answer", conv, "--action", "autopilot", "--json"))["ok"] is True


def _commands() -> list[list[str]]:
    from agentctl.cli import cli

    ctx = click.Context(cli)
    out: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])  # type: ignore[arg-type]
        else:
            out.append(path)

    walk(cli, [])
    return out


def test_every_command_shows_examples_in_its_help(daemon: Daemon) -> None:
    missing = []
    for path in _commands():
        cp = daemon.agentctl(*path, "--help")
        assert cp.returncode == 0, (path, cp.stderr)
        text = cp.stdout
        examples = text.split("Examples:", 1)[1].split("Options:", 1)[0] if "Examples:" in text else ""
        if f"agentctl {' '.join(path)}" not in examples and "agentctl " not in examples:
            missing.append(" ".join(path))
    assert not missing, f"no examples in the help of: {', '.join(missing)}"


def _bash_complete(d: Daemon, words: str) -> list[str]:
    """Complete the last word of ``words`` as bash does, with the script `agentctl completion bash` prints."""
    script = d.agentctl("completion", "bash").stdout
    agentctl = d.root / "agentctl"
    agentctl.write_text(f"#!/bin/sh\nexec {sys.executable} -m agentctl --socket {d.socket} \"$@\"\n")
    agentctl.chmod(0o755)
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    empty = '""' if words.endswith(" ") else ""
    driver = (f"{script}\nCOMP_WORDS=({words}{empty}); COMP_CWORD={cword}\n"
              "_agentctl_completion agentctl\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    env = {**d.env, "PATH": f"{d.root}:{os.environ['PATH']}"}
    cp = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, env=env, timeout=60, cwd=d.root)
    assert cp.returncode == 0, cp.stderr
    return [line for line in cp.stdout.splitlines() if line]


def test_completion_scripts_complete_commands_options_providers_and_conversation_ids(daemon: Daemon, tmp_path: Path) -> None:
    assert shutil.which("bash")
    for shell, mark in (("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --no-files --command agentctl")):
        cp = daemon.agentctl("completion", shell)
        assert cp.returncode == 0 and mark in cp.stdout and "_AGENTCTL_COMPLETE" in cp.stdout, (shell, cp.stdout[:200])
    conv = one_json(daemon.agentctl("new", "--cwd", str(tmp_path), "--title", "completed", "--json"))["id"]
    assert {"status", "stop", "steer"} <= set(_bash_complete(daemon, "agentctl st"))
    assert "--max-cost-usd" in _bash_complete(daemon, "agentctl run --max")
    assert "script" in _bash_complete(daemon, "agentctl new -p ")
    assert conv in _bash_complete(daemon, f"agentctl show {conv[:3]}")
    assert conv in _bash_complete(daemon, "agentctl rm --force ")


def test_under_json_every_line_of_stderr_is_a_json_object_also_for_notices(daemon: Daemon, tmp_path: Path) -> None:
    cp = daemon.agentctl("run", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(tmp_path), "--exit-on-action", "--json",
                         "go")
    assert cp.returncode == 4, cp.stderr
    assert json.loads(cp.stdout.splitlines()[-1])["state"] == "requires_action"
    lines = [json.loads(line) for line in cp.stderr.splitlines()]
    # Exit 4 is reported as every other failing exit is: docs/cli.md's error object, code needs_action.
    assert lines and lines[-1]["code"] == "needs_action" and lines[-1]["exit_code"] == 4, lines
    assert "needs action" in lines[-1]["message"]


def test_text_names_and_amounts_agentd_cannot_take_are_usage_errors_before_anything_is_done(
        daemon: Daemon, tmp_path: Path) -> None:
    # Bytes that are not UTF-8 (argv, stdin, a directory's name) were a traceback, after `run`
    # had created its conversation; `--max-cost-usd nan` removed a budget, exit 0.
    cid = one_json(daemon.agentctl("new", "--cwd", str(tmp_path), "--max-cost-usd", "5", "--json"))["id"]
    latin = os.fsdecode(b"caf\xe9")
    before = {r["id"] for r in one_json(daemon.agentctl("ls", "--all", "--json"))["conversations"]}
    for args in (["send", cid, latin], ["run", latin], ["--json", "run", latin], ["new", "--title", latin],
                 ["new", "--cwd", str(tmp_path / latin)]):
        cp = daemon.agentctl(*args)
        assert cp.returncode == 2 and "not UTF-8" in cp.stderr and "Traceback" not in cp.stderr, (args, cp.stderr)
        if "--json" in args:
            assert json.loads(cp.stderr)["code"] == "usage"
    assert {r["id"] for r in one_json(daemon.agentctl("ls", "--all", "--json"))["conversations"]} == before
    piped = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "send", cid, "-"],
                           input=b"caf\xe9 au lait\n", capture_output=True, env=daemon.env, timeout=60)
    assert piped.returncode == 2 and b"not UTF-8" in piped.stderr and b"Traceback" not in piped.stderr
    (tmp_path / latin).mkdir()
    inside = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "new"],
                            capture_output=True, env=daemon.env, cwd=tmp_path / latin, timeout=60)
    assert inside.returncode == 2 and b"not UTF-8" in inside.stderr and b"Traceback" not in inside.stderr
    for amount in ("nan", "inf", "1e999"):
        cp = daemon.agentctl("budget", cid, "--max-cost-usd", amount)
        assert cp.returncode == 2 and "not a finite number" in cp.stderr, (amount, cp.stderr)
    assert daemon.record(cid)["budget"]["max_cost_usd"] == 5


def test_a_title_given_at_new_is_checked_as_title_checks_it(daemon: Daemon, tmp_path: Path) -> None:
    # A newline in `new --title` made a forged row of `agentctl ls`; 5,000 characters were kept.
    forged = "mine\ncdeadbeef0000  idle   script  not a real conversation"
    cid = one_json(daemon.agentctl("new", "--cwd", str(tmp_path), "--title", forged, "--json"))["id"]
    assert daemon.record(cid)["title"] == " ".join(forged.split())
    assert "\ncdeadbeef0000" not in daemon.agentctl("ls").stdout
    long = daemon.agentctl("new", "--cwd", str(tmp_path), "--title", "t" * 5000)
    assert long.returncode == 8 and "at most 200 characters" in long.stderr


def test_the_completion_install_lines_work_in_a_fresh_home(daemon: Daemon, tmp_path: Path) -> None:
    # What the README and `completion --json`'s "install" give a person to paste: on a new
    # account the completion folders do not exist yet.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "agentctl").write_text(f'#!/bin/sh\nexec {sys.executable} -m agentctl --socket {daemon.socket} "$@"\n')
    (shim / "agentctl").chmod(0o755)
    for shell, path in (("bash", ".local/share/bash-completion/completions/agentctl"),
                        ("fish", ".config/fish/completions/agentctl.fish")):
        home = tmp_path / f"home-{shell}"
        home.mkdir()
        line = one_json(daemon.agentctl("completion", shell, "--json"))["install"]
        env = {**daemon.env, "HOME": str(home), "PATH": f"{shim}:{os.environ['PATH']}"}
        done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
        assert "_AGENTCTL_COMPLETE" in (home / path).read_text()
