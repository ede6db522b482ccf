"""The live view: real agentctl on a pseudo-terminal against a real agentd (script provider).

What agentctl writes to the terminal is fed, as it arrives, to a terminal emulator
(pyte), so the tests assert on what a person sees and when: a running tool's
output redrawn in place, the spinner, Markdown, the end-of-turn line, the bell
and the desktop notification. The same commands in a pipe stay plain text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from daemon_harness import Daemon
from terminal import Term

SCRIPTS = Path(__file__).parent / "scripts"


def _conv(daemon: Daemon) -> str:
    out = daemon.agentctl("ls", "--json")
    rows = json.loads(out.stdout)
    return rows[0]["id"] if isinstance(rows, list) else rows["conversations"][0]["id"]


def _no_color(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "NO_COLOR"}


def test_a_running_tools_output_streams_in_place_under_a_spinner(daemon: Daemon, workdir: Path) -> None:
    t = Term(daemon, "run", "-p", "script", "-m", str(SCRIPTS / "live-tool.toml"), "--cwd", str(workdir), "build")
    # While the tool runs (4 s of output), its newest lines show under it, with the spinner.
    seen = t.wait_for(lambda s: "│ build-step-2" in s)
    assert "built-ok" not in seen and "completed" not in seen, seen  # shown before the tool ended
    assert re.search(r"⠋|⠙|⠹|⠸|⠼|⠴|⠦|⠧|⠇|⠏", seen) and re.search(r"bash running · \ds", seen), seen
    # In place: the region keeps the newest lines only, it does not scroll them all by.
    seen = t.wait_for(lambda s: "│ build-step-7" in s)
    assert "build-step-1" not in seen and "build-step-2" not in seen, seen
    assert seen.count("⚙ bash") == 1, seen
    # Then the tool ended; waiting for the model again: the spinner says so, with the time.
    seen = t.wait_for(lambda s: "✓ bash" in s and re.search(r"working · \ds", s))
    assert t.wait_exit() == 0, t.text()
    final = t.text()
    assert "│" not in final and "running ·" not in final and "working ·" not in final, final  # the region is gone
    lines = final.splitlines()
    assert re.fullmatch(r"✓ turn completed · \d+\.\ds · 1,545 tokens \(1,200 in, 345 out\) · \$0\.0042", lines[-1]), final
    assert lines[-2] == "Built.", final
    assert "  built-ok" in final  # the end of what it printed, as before
    # One title line at most: the title agentd made from the prompt is the prompt line itself.
    assert "title:" not in final, final

    # The same turn in a pipe reads as today: no redraws, no spinner, no summary.
    conv = _conv(daemon)
    piped = daemon.agentctl("tail", conv, "--no-follow")
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout and "\a" not in piped.stdout
    assert "build-step-2" not in piped.stdout and "running ·" not in piped.stdout
    assert piped.stdout.rstrip().endswith("✓ turn completed"), piped.stdout
    assert "· title:" not in piped.stdout and "› build" in piped.stdout
    # The todo list was done before the turn ended: attaching afterwards does not repeat it.
    attach = daemon.agentctl("attach", conv, "--until-idle")
    assert attach.returncode == 0, attach.stderr
    assert "todos" not in attach.stdout, attach.stdout


def test_assistant_markdown_is_rendered_on_a_terminal_and_kept_as_written_in_a_pipe(daemon: Daemon,
                                                                                     workdir: Path) -> None:
    t = Term(daemon, "run", "-p", "script", "-m", str(SCRIPTS / "live-md.toml"), "--cwd", str(workdir), "notes",
             env=_no_color(daemon.env))
    assert t.wait_exit() == 0, t.text()
    screen = t.text()
    assert "Release notes" in screen and "# Release notes" not in screen, screen
    assert "Some bold words and inline code." in screen and "**" not in screen, screen
    assert "• first point" in screen and "• second point" in screen, screen
    assert "def answer():" in screen and "```" not in screen, screen
    assert "<b>not html</b> done." in screen, screen  # HTML the agent wrote is text
    raw = t.raw.decode("utf-8", "replace")
    assert re.search(r"\x1b\[[0-9;]*mdef\x1b\[0m", raw), raw  # the code block is highlighted
    assert re.search(r"\x1b\[1mbold\x1b\[0m", raw), raw
    piped = daemon.agentctl("tail", _conv(daemon), "--no-follow")
    assert "# Release notes" in piped.stdout and "```python" in piped.stdout and "**bold**" in piped.stdout
    assert "\x1b" not in piped.stdout


def test_agentctl_status_does_not_import_the_renderer(daemon: Daemon) -> None:
    probe = (
        "import sys\n"
        "from agentctl.cli import cli\n"
        f"try:\n    cli.main(['--socket', {str(daemon.socket)!r}, 'status'], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "heavy = ('rich', 'markdown_it', 'pygments')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from agentctl.liveview import markdown\n"
        "markdown('# x', 80, False)\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    cp = subprocess.run([sys.executable, "-c", probe], env=daemon.env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    after_status, after_render = cp.stdout.strip().splitlines()[-2:]
    assert after_status == "[]", cp.stdout
    assert after_render == "['markdown_it', 'pygments', 'rich']", cp.stdout  # the probe sees an import


def test_a_waiting_interaction_rings_the_bell_and_notifies_unless_turned_off(tmp_path: Path, workdir: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "notify.log"
    fake = bin_dir / "notify-send"
    fake.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n--\\n' \"$a\"; done >> {log}\n")
    fake.chmod(0o755)
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", "[agentctl]\nbell = true\nnotify = true\n",
               env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}).start()
    try:
        t = Term(d, "run", "-p", "script", "-m", str(SCRIPTS / "live-perm.toml"), "--cwd", str(workdir), "go")
        t.wait_for(lambda s: "choose 1-3:" in s)
        assert b"\a" in t.raw
        deadline = time.monotonic() + 10
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        args = log.read_text().split("\n--\n")
        assert args[0] == "--app-name=agentctl" and args[1] == "agentd: permission waiting", args
        assert args[2].startswith("Allow bash?\nconversation "), args
        t.type("1\n")
        assert t.wait_exit() == 0, t.text()
        assert log.read_text().count("--app-name") == 1  # once per interaction

        log.unlink()
        d.config.write_text("[agentctl]\nbell = false\nnotify = false\n")
        t = Term(d, "run", "-p", "script", "-m", str(SCRIPTS / "live-perm.toml"), "--cwd", str(workdir), "go")
        t.wait_for(lambda s: "choose 1-3:" in s)
        t.type("1\n")
        assert t.wait_exit() == 0, t.text()
        assert b"\a" not in t.raw and not log.exists()
    finally:
        d.stop()


def test_answer_hints_name_the_real_option_ids_and_the_answerer_is_verbose_only(daemon: Daemon,
                                                                                workdir: Path) -> None:
    cp = daemon.agentctl("run", "-p", "script", "-m", str(SCRIPTS / "live-perm.toml"), "--cwd", str(workdir), "go",
                         "--exit-on-action")
    assert cp.returncode == 4, cp.stdout + cp.stderr
    conv = _conv(daemon)
    assert f"answer {conv} 1-2-permission --option allow_always" in cp.stdout, cp.stdout
    assert "--option ID" not in cp.stdout
    assert daemon.agentctl("answer", conv, "--allow").returncode == 0
    done = daemon.agentctl("attach", conv, "--until-idle", "--after", "0")
    assert done.returncode == 0, done.stderr
    assert "answered 1-2-permission (Allow bash?): Allow once\n" in done.stdout, done.stdout
    verbose = daemon.agentctl("tail", conv, "--no-follow", "--verbose")
    assert re.search(r"answered 1-2-permission \(Allow bash\?\): Allow once by pid \d+ uid \d+", verbose.stdout)


def test_an_error_never_runs_into_streamed_text_and_a_lease_takeover_is_verbose_only(tmp_path: Path,
                                                                                     workdir: Path) -> None:
    script = tmp_path / "stream.toml"
    script.write_text('[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "streaming slowly along"\n'
                      'chunk = 3\ndelay_ms = 400\n[[turn.step]]\nkind = "wait"\n')
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d").start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "run", "-p", "script", "-m", str(script),
             "--cwd", str(workdir), "go"],
            env=d.env, cwd=d.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        got = b""
        while b"stre" not in got:
            got += os.read(proc.stdout.fileno(), 100)
        d.kill()
        rest, _ = proc.communicate(timeout=30)
        out = (got + rest).decode()
        assert proc.returncode != 0
        assert re.search(r"\nstre[a-z ]*\nagentctl: ", out), out  # the message starts a line of its own
        conv = _conv_after_restart(d)
        plain = d.agentctl("tail", conv, "--no-follow")
        assert "lease taken over" not in plain.stdout, plain.stdout
        assert "lease taken over" in d.agentctl("tail", conv, "--no-follow", "-v").stdout
    finally:
        d.stop()


def _conv_after_restart(d: Daemon) -> str:
    d.start()
    conv = _conv(d)
    d.agentctl("send", conv, "again")  # reopening takes the dead daemon's lease over
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if any(r["type"] == "lease" and r["data"]["action"] == "taken_over" for r in d.journal(conv)):
            return conv
        time.sleep(0.1)
    raise AssertionError(f"no lease takeover in {d.journal(conv)}")


def test_json_at_a_terminal_stays_json_lines_with_no_live_view(daemon: Daemon, workdir: Path) -> None:
    t = Term(daemon, "run", "-p", "script", "-m", str(SCRIPTS / "live-tool.toml"), "--cwd", str(workdir), "build",
             "--json")
    assert t.wait_exit(60) == 0, t.text()
    raw = t.raw.decode()
    assert "\x1b" not in raw and "\a" not in raw and "running ·" not in raw
    lines = [json.loads(x) for x in raw.replace("\r\n", "\n").splitlines() if x.strip()]
    assert lines[-1]["type"] == "result" and lines[-1]["state"] == "completed", lines[-1]
    running = [x for x in lines if x["type"] == "item" and x["data"].get("tool", {}).get("tail")]
    assert running, "the running tool's tail is in the stream, as records"
