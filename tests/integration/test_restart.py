"""agentctl restart, SIGHUP and agentd reload, through the real daemon, a real ACP agent process and
the real agentctl: a new config and environment for runtimes started afterwards, running turns
left alone (or cancelled with --now, said so), a broken config refused with the old one kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import REPO, Daemon

SCRIPTS = REPO / "conf" / "scripts"
AGENT = Path(__file__).parent / "acp_env_agent.py"


def config(conf_value: str, *, extra: str = "") -> str:
    return (f'[providers.acp.env]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]\n'
            f'env = {{ AGENTD_T_CONF = "{conf_value}" }}\n{extra}')


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, config("one")).start()
    try:
        yield d
    finally:
        d.stop()


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def agent_env(d: Daemon, name: str) -> str:
    """What a new conversation's agent process has for ``name`` (it answers ``env:NAME=value``)."""
    cp = d.agentctl("run", "-p", "acp:env", "--cwd", str(d.root), "--json", f"env {name}", timeout=90)
    assert cp.returncode == 0, cp.stderr
    marker = f"env:{name}="
    for line in cp.stdout.splitlines():
        rec = json.loads(line)
        text = rec["data"].get("text", "") if rec.get("type") == "item" else ""
        if marker in text:
            return text.split(marker, 1)[1].strip()
    raise AssertionError(f"no {marker} in {cp.stdout}")


def wait_state(d: Daemon, conv: str, *states: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = one_json(d.agentctl("show", conv, "--json"))
        if info["record"]["state"] in states:
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def last_turn(d: Daemon, conv: str) -> dict[str, Any]:
    turns = [r for r in d.journal(conv) if r["type"] == "turn" and r["data"].get("state") != "working"]
    return turns[-1]["data"]


def test_restart_gives_runtimes_started_afterwards_the_new_config_and_environment_file(daemon: Daemon) -> None:
    assert agent_env(daemon, "AGENTD_T_CONF") == "one"
    assert agent_env(daemon, "AGENTD_T_FILE") == "<unset>"
    daemon.config.write_text(config("two"))
    env_file = daemon.root / "environment"  # beside agentd.toml: what the systemd units name
    env_file.write_text("# keys for agentd\nexport AGENTD_T_FILE='from the file'\n")
    env_file.chmod(0o600)
    pid = one_json(daemon.agentctl("status", "--json"))["pid"]
    res = one_json(daemon.agentctl("restart", "--json"))
    assert res["pid"] == pid  # in place: the same process, connections and conversations kept
    assert res["env_file"] == str(env_file) and res["env_changed"] == ["AGENTD_T_FILE"]
    assert res["cancelled"] == [] and {p["name"]: p["available"] for p in res["providers"]}["acp:env"] is True
    assert agent_env(daemon, "AGENTD_T_CONF") == "two"
    assert agent_env(daemon, "AGENTD_T_FILE") == "from the file"
    assert "from the file" not in daemon.log.read_text()  # names only, never values
    human = daemon.agentctl("restart")
    assert human.returncode == 0 and human.stdout.startswith(f"restarted agentd in place (pid {pid}, the same process)"), human.stderr
    assert "acp:env: available" in human.stdout


def test_restart_waits_for_a_running_turn_and_does_not_cut_it(daemon: Daemon) -> None:
    conv = one_json(daemon.agentctl("new", "-p", "script", "-m", str(SCRIPTS / "tool.toml"), "--cwd", str(daemon.root),
                                    "--json"))["id"]
    run = one_json(daemon.agentctl("send", conv, "go", "--json"))["run"]
    wait_state(daemon, conv, "requires_action")
    daemon.config.write_text(config("three"))
    restart = subprocess.Popen([sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "restart", "--json"],
                               env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert restart.poll() is None, restart.communicate()  # it waits: the turn runs
        one_json(daemon.agentctl("answer", conv, "--allow", "--json"))
        out, err = restart.communicate(timeout=60)
    finally:
        if restart.poll() is None:
            restart.kill()
    assert restart.returncode == 0, err
    res = json.loads(out)
    assert res["waited_s"] >= 1.5 and res["cancelled"] == []
    wait_state(daemon, conv, "idle")
    assert last_turn(daemon, conv)["state"] == "completed"
    assert (daemon.root / "agentd-tool.txt").read_text() == "written by agentd\n"
    assert [r for r in daemon.journal(conv) if r["type"] == "turn"][-1]["run"] == run
    assert agent_env(daemon, "AGENTD_T_CONF") == "three"


def test_restart_now_cancels_the_running_turns_and_says_which(daemon: Daemon) -> None:
    conv = one_json(daemon.agentctl("new", "-p", "script", "-m", str(SCRIPTS / "wait.toml"), "--cwd", str(daemon.root),
                                    "--json"))["id"]
    run = one_json(daemon.agentctl("send", conv, "go", "--json"))["run"]
    wait_state(daemon, conv, "running")
    cp = daemon.agentctl("restart", "--now")
    assert cp.returncode == 0, cp.stderr
    assert f"cancelled run {run} (--now)" in cp.stderr
    wait_state(daemon, conv, "idle")
    assert last_turn(daemon, conv)["state"] == "cancelled"
    # and the conversation goes on, on the provider declared anew
    cp = daemon.agentctl("send", conv, "steer me", "--json")
    assert cp.returncode == 0, cp.stderr


def test_a_broken_config_is_refused_with_its_error_and_the_old_one_stays(daemon: Daemon) -> None:
    daemon.config.write_text(config("bad", extra="[budgets.acp-env]\nmax_cost_usd = 1\n"))
    cp = daemon.agentctl("restart", "--json")
    assert cp.returncode == 8 and cp.stdout == ""
    err = json.loads(cp.stderr)
    assert err["code"] == "invalid" and err["details"]["key"] == 'budgets.acp-env'
    assert 'did you mean "acp:env"?' in err["message"] and "keeps the one it had" in err["message"]
    assert agent_env(daemon, "AGENTD_T_CONF") == "one"  # the config in force stays
    reload = subprocess.run([sys.executable, "-m", "agentd", "reload"], env=daemon.env, capture_output=True,
                            text=True, timeout=60)
    assert reload.returncode == 78, reload.stderr
    assert "budgets.acp-env" in reload.stderr
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_sighup_reloads_as_restart_does(daemon: Daemon) -> None:
    assert "acp:second" not in one_json(daemon.agentctl("status", "--json"))["providers"]
    daemon.config.write_text(config("one", extra=f'[providers.acp.second]\ncommand = [{json.dumps(sys.executable)}, '
                                                 f'{json.dumps(str(AGENT))}]\n'))
    assert daemon.proc is not None
    os.kill(daemon.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "acp:second" not in one_json(daemon.agentctl("status", "--json"))["providers"]:
        assert time.monotonic() < deadline, daemon.log.read_text()[-2000:]
        time.sleep(0.1)
    assert daemon.proc.poll() is None
    while '"agentd.reloaded"' not in daemon.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # a broken config on SIGHUP: logged, refused, the daemon goes on with the one it had
    daemon.config.write_text("[providers]\ndefault = \"nope\"\n")
    os.kill(daemon.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while '"agentd.reload_refused"' not in daemon.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "acp:second" in one_json(daemon.agentctl("status", "--json"))["providers"]


def test_providers_script_env_reaches_the_commands_its_tools_run_and_restart_applies_a_change(tmp_path: Path) -> None:
    (tmp_path / "env.toml").write_text('model = "env"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "tool"\n'
                                       'command = "echo script=${AGENTD_T_SCRIPT:-unset}"\n')
    d = Daemon(tmp_path, '[providers.script.env]\nAGENTD_T_SCRIPT = "first"\n').start()
    try:
        def tool_output() -> str:
            cp = d.agentctl("run", "-p", "script", "-m", str(tmp_path / "env.toml"), "--cwd", str(tmp_path), "--json",
                            "go")
            assert cp.returncode == 0, cp.stderr
            return next(json.loads(line)["data"]["tool"]["output"] for line in cp.stdout.splitlines()
                        if '"tool"' in line and '"output":"script=' in line).strip()

        assert tool_output() == "script=first"
        d.config.write_text('[providers.script.env]\nAGENTD_T_SCRIPT = "second"\n')
        assert one_json(d.agentctl("restart", "--json"))["cancelled"] == []
        assert tool_output() == "script=second"
    finally:
        d.stop()


def test_an_environment_file_writable_by_group_is_refused_at_restart_and_at_start(daemon: Daemon) -> None:
    # It sets the environment every runtime starts from (LD_PRELOAD, NODE_OPTIONS, keys): config, by the trust rule.
    env_file = daemon.root / "environment"
    env_file.write_text("AGENTD_T_FILE=planted\n")
    env_file.chmod(0o664)
    cp = daemon.agentctl("restart", "--json")
    assert cp.returncode == 8, cp
    err = json.loads(cp.stderr)
    assert err["code"] == "invalid" and "keeps the one it had" in err["message"]
    assert f"environment file {env_file}: writable by group (mode 0664)" in err["message"], err
    assert agent_env(daemon, "AGENTD_T_FILE") == "<unset>"
    daemon.stop()
    proc = subprocess.run([sys.executable, "-m", "agentd", "run"], env=daemon.env, cwd=daemon.root,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 78, proc
    assert f"agentd: environment file {env_file}: writable by group (mode 0664)" in proc.stderr, proc.stderr
    env_file.unlink()
    env_file.symlink_to(daemon.root / "elsewhere")  # never followed, not even to a file of ours
    (daemon.root / "elsewhere").write_text("AGENTD_T_FILE=through-a-link\n")
    (daemon.root / "elsewhere").chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "agentd", "run"], env=daemon.env, cwd=daemon.root,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 78 and f"environment file {env_file}: a symlink (to " in proc.stderr, proc.stderr
    env_file.unlink()
    daemon.start()  # the fixture stops it


def test_an_environment_file_is_read_as_systemd_reads_it_and_bad_lines_or_a_deep_config_never_end_the_daemon(
        daemon: Daemon) -> None:
    # A NUL byte in the file, or a config nested 2,000 deep, ended the daemon at SIGHUP (and a
    # restart was an internal error that had set the lines before the bad one); quotes, escapes
    # and continued lines were read otherwise than systemd reads them, so a restart changed a
    # value systemd had set right.
    env_file = daemon.root / "environment"
    env_file.write_bytes(b'AGENTD_T_FILE="pa\\"ss"\nAGENTD_T_CONT=one\\\ntwo\nBAD=a\0b\nAGENTD_T_MIXED="a"b\n')
    env_file.chmod(0o600)
    res = one_json(daemon.agentctl("restart", "--json"))
    assert res["env_changed"] == ["AGENTD_T_CONT", "AGENTD_T_FILE", "AGENTD_T_MIXED"]
    assert agent_env(daemon, "AGENTD_T_FILE") == 'pa"ss' and agent_env(daemon, "AGENTD_T_MIXED") == "ab"
    assert agent_env(daemon, "AGENTD_T_CONT") == "onetwo" and agent_env(daemon, "BAD") == "<unset>"
    assert "line 4: the value of BAD holds a NUL byte" in daemon.log.read_text()
    assert one_json(daemon.agentctl("restart", "--json"))["env_changed"] == []  # read the same way again

    daemon.config.write_text(config("deep", extra="deep = " + "[" * 2000 + "]" * 2000 + "\n"))
    refused = daemon.agentctl("restart")
    assert refused.returncode == 8 and "nested too deeply" in refused.stderr, refused.stderr
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert daemon.proc.poll() is None and daemon.agentctl("status").returncode == 0

    daemon.config.write_text(config("four", extra="[journal]\nbatch_ms = inf\n[checkpoints]\nenabled = false\n"))
    inf = daemon.agentctl("restart")
    assert inf.returncode == 8 and "journal.batch_ms" in inf.stderr, inf.stderr
    daemon.config.write_text(config("four", extra='[checkpoints]\nenabled = false\n[mcp.servers.x]\ncommand = "true"\n'))
    res = one_json(daemon.agentctl("restart", "--json"))
    assert set(res["need_stop"]) == {"checkpoints", "mcp"}
    assert "applied only after agentctl stop and a start: [checkpoints], [mcp]" in daemon.agentctl("restart").stderr
