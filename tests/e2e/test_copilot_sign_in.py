"""``agentctl login copilot --device``, ``account``, ``quota`` and ``logout`` through a real
daemon and the real Copilot CLI, against a local stand-in of GitHub's device-flow endpoints
(the CLI takes ``--host``; agentd passes the config's ``COPILOT_GH_HOST``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance import _descendants
from daemon_harness import Daemon
from github_standin import CODE, LOGIN, TOKEN, GitHubStandIn

pytestmark = pytest.mark.e2e
q = json.dumps


@pytest.fixture
def standin():
    gh = GitHubStandIn().start()
    try:
        yield gh
    finally:
        gh.stop()


def _daemon(tmp_path: Path, cli: str, gh: GitHubStandIn, home: Path) -> Daemon:
    home.mkdir()
    config = ("[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
              f"[providers.copilot]\ncli_path = {q(cli)}\ncopilot_home = {q(str(home))}\n"
              f"[providers.copilot.env]\nCOPILOT_GH_HOST = {q(gh.url)}\n")
    env = {v: "" for v in ("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN")}
    return Daemon(tmp_path, config, env=env).start()


#: runs its arguments as a command with SIGINT at its default, as at a terminal: a shell's background
#: job (`bash .ci/run &`, no job control) starts with SIGINT ignored, its children inherit that across
#: exec, and Python then leaves Ctrl-C ignored (the CI flake: agentctl outlived its SIGINT)
_SIGINT_AT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")


def _login_lines(d: Daemon, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "--json", "login", "copilot", "--device", *args]
    return subprocess.Popen([sys.executable, "-c", _SIGINT_AT_DEFAULT, *argv], env=d.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_device_sign_in_shows_the_code_waits_for_approval_and_signs_the_runtime_in(
        tmp_path: Path, copilot_cli: str, standin: GitHubStandIn) -> None:
    d = _daemon(tmp_path, copilot_cli, standin, tmp_path / "copilot-home")
    try:
        before = json.loads(d.agentctl("providers", "show", "copilot", "--json", timeout=120).stdout)
        assert before["state"] == "needs_sign_in" and before["fix"] == "agentctl login copilot --device", before
        assert before["capabilities"]["device_sign_in"] is True and before["capabilities"]["quota"] is True
        proc = _login_lines(d, "--store-plaintext")
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["device"] == {"url": f"{standin.url}/login/device", "code": CODE, "notice": ""}, first
        assert proc.poll() is None  # waits for the person
        standin.approve()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        done = json.loads(out)
        assert done["done"] is True and done["account"]["login"] == LOGIN and done["account"]["signed_in"] is True
        acct = d.agentctl("--json", "account", "copilot", timeout=120)
        assert acct.returncode == 0, acct.stderr
        assert json.loads(acct.stdout)["accounts"][0]["account"]["source"] == "stored"
        assert TOKEN not in acct.stdout and TOKEN not in d.log.read_text()
        shown = json.loads(d.agentctl("providers", "show", "copilot", "--json", timeout=120).stdout)
        assert shown["state"] == "available", shown
        # The signed-in catalog, as the CLI fetched it from the account's Copilot API (the stand-in's).
        listed = d.agentctl("--json", "models", "copilot", timeout=120)
        assert listed.returncode == 0, listed.stderr
        by = {m["id"]: m for m in json.loads(listed.stdout)["models"]}
        assert by["standin-large"] == {"id": "standin-large", "name": "Stand-in Large", "efforts": ["low", "medium", "high"],
                                       "context_tiers": [{"id": "default", "tokens": 400000}], "cost_tier": "high"}
        assert by["standin-small"]["cost_tier"] == "low" and by["standin-small"]["context_tiers"][0]["tokens"] == 128000
        work = tmp_path / "work"
        work.mkdir()
        refused = d.agentctl("new", "-p", "copilot", "-m", "standin-large", "--effort", "max", "--cwd", str(work))
        assert refused.returncode == 8 and "low, medium, high" in refused.stderr, refused.stderr
        # The account's quota, as the CLI reads it from GitHub (here: the stand-in's snapshot).
        quota = d.agentctl("--json", "quota", "copilot", timeout=120)
        assert quota.returncode == 0, quota.stderr
        (info,) = json.loads(quota.stdout)["quotas"]
        assert info["source"] == "account" and info["quotas"] == [{
            "type": "premium_interactions", "used": 60.0, "entitlement": 300.0, "unlimited": False,
            "remaining_percent": 80.0, "overage": 0.0, "reset_at": "2027-01-01", "unit": "requests", "plan": "individual"}]
        assert "premium_interactions" in d.agentctl("quota", timeout=120).stdout
        # Copilot CLI 1.0.102 removes a sign-in from the system keychain only; one it kept in its
        # config file (no keychain here) it cannot remove: agentd reports its refusal as it is.
        out = d.agentctl("logout", "copilot", timeout=120)
        assert out.returncode == 8 and "Keychain" in out.stderr, (out.returncode, out.stderr)
        assert d.agentctl("account", "copilot", timeout=120).returncode == 0
        assert TOKEN not in d.log.read_text()
    finally:
        d.stop()


def test_device_sign_in_without_a_keychain_asks_before_a_plain_file_and_ctrl_c_cancels_it(
        tmp_path: Path, copilot_cli: str, standin: GitHubStandIn) -> None:
    d = _daemon(tmp_path, copilot_cli, standin, tmp_path / "copilot-home")
    try:
        # Ctrl-C while waiting: agentctl exits 130 and the daemon ends the CLI's login process.
        proc = _login_lines(d)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["device"]["code"] == CODE
        logins = [p for p in _descendants(d.proc.pid) if _login_start(p)]  # one may end while listed
        assert logins, "no copilot login process runs under the daemon"
        proc.send_signal(signal.SIGINT)
        assert _exit_status(proc, 30) == 130
        deadline = time.monotonic() + 15
        while any(_login_start(p) for p in logins):
            assert time.monotonic() < deadline, "the login process outlived the cancelled flow"
            time.sleep(0.1)
        # Approved, but no consent to a plain file: no sign-in, and the message says how.
        standin.approve()
        refused = d.agentctl("login", "copilot", "--device", timeout=120)
        assert refused.returncode == 8, (refused.stdout, refused.stderr)
        assert CODE in refused.stdout and "--store-plaintext" in refused.stderr
        assert d.agentctl("account", "copilot", timeout=120).returncode == 4
    finally:
        d.stop()


def _exit_status(proc: subprocess.Popen[str], timeout: float) -> int:
    """``proc``'s exit status within ``timeout`` s; else it is killed and the failure shows where it
    waited (its signal masks and each thread's wait channel and syscall, from /proc) and its stderr."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        where = []
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            where += [line for line in status if line.startswith(("Sig", "ShdPnd", "State"))]
            for task in sorted(Path(f"/proc/{proc.pid}/task").iterdir()):
                parts = [(task / name).read_text().strip() for name in ("comm", "wchan", "syscall")]
                where.append(f"thread {task.name}: " + " | ".join(parts))
        except OSError as exc:
            where.append(f"/proc: {exc}")
        proc.kill()
        _, err = proc.communicate(10)
        raise AssertionError(f"still running {timeout:g} s after the signal:\n" + "\n".join(where)
                             + f"\nstderr: {err[-2000:]}") from None


def _login_start(pid: int) -> str:
    """The start time (/proc stat field 22) of ``pid`` when it is a ``copilot login`` process, else "".
    A descendant may end between the listing and the read (the CLI's short-lived helpers): then ""."""
    try:
        if b"login" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return ""
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def test_sigkill_of_agentd_while_a_device_sign_in_waits_leaves_no_copilot_login_process(
        tmp_path: Path, copilot_cli: str, standin: GitHubStandIn) -> None:
    """The CLI polls GitHub for up to 15 minutes; it runs under agentd's keeper like every runtime
    (issue 13, item 1), so agentd's SIGKILL ends it, and the next start finds nothing to reap."""
    d = _daemon(tmp_path, copilot_cli, standin, tmp_path / "copilot-home")
    try:
        proc = _login_lines(d)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["device"]["code"] == CODE
        logins = {p: start for p in _descendants(d.proc.pid) if (start := _login_start(p))}
        assert logins, "no copilot login process runs under the daemon"
        records = list((d.state_dir / "runtimes").glob("*.json"))
        assert any(json.loads(r.read_text())["what"] == "copilot login" for r in records), records
        d.kill()
        proc.wait(30)

        def left() -> list[int]:
            out = []
            for pid, start in logins.items():
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if stat[19] == start and stat[0] != "Z":
                    out.append(pid)
            return out

        deadline = time.monotonic() + 15
        while left():
            assert time.monotonic() < deadline, f"copilot login outlived agentd's SIGKILL: {left()}"
            time.sleep(0.1)
        d.start()
        assert d.agentctl("account", "copilot", timeout=120).returncode == 4  # never signed in
    finally:
        d.stop()


def test_token_sign_in_hands_the_token_to_the_cli_which_checks_it_with_github(
        tmp_path: Path, copilot_cli: str, standin: GitHubStandIn) -> None:
    d = _daemon(tmp_path, copilot_cli, standin, tmp_path / "copilot-home")
    try:
        out = d.agentctl("--json", "login", "copilot", "--with-token", input=TOKEN + "\n", timeout=120)
        assert out.returncode == 0, out.stderr
        acct = json.loads(out.stdout)["account"]
        assert acct["signed_in"] is True and acct["login"] == LOGIN and "not stored" in acct["message"]
        assert ("GET", "/copilot_internal/user") in standin.requests
        assert TOKEN not in out.stdout and TOKEN not in d.log.read_text()
    finally:
        d.stop()
