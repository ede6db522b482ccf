"""``agentctl providers``, ``account``, ``login``, ``logout``, ``quota`` and the richer model
catalogs through a real daemon, with the real Claude Code (bundled in claude-agent-sdk) and the
real Codex app-server where they answer offline (``claude auth status``, ``account/read``,
``account/login/start`` with an API key), and a provider of each state."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from daemon_harness import Daemon

AGENT = Path(__file__).with_name("acp_models_agent.py")
KEY = "AGENTD_TEST_ACCOUNTS_KEY"
q = json.dumps


def _claude_cli() -> str:
    from agentd.providers.claude import bundled_cli

    cli = bundled_cli()
    assert cli, "claude-agent-sdk bundles Claude Code"
    return cli


def _codex_cli() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from installs import install_codex_cli

    return str(install_codex_cli())


def _config(tmp_path: Path, *, scripts_dir: str = "") -> str:
    (tmp_path / "claude-config").mkdir(exist_ok=True)
    (tmp_path / "claude-home").mkdir(exist_ok=True)
    return (
        f"[providers.script]\nscripts_dir = {q(scripts_dir)}\n"
        f"[providers.copilot]\ncli_path = {q(str(tmp_path / 'no-copilot'))}\n"
        "[providers.codex]\nenabled = false\n"
        f"[providers.claude]\ncli_path = {q(_claude_cli())}\napi_key_env = {q(KEY)}\nmodel = \"claude-test-model\"\n"
        f"config_dir = {q(str(tmp_path / 'claude-config'))}\n"
        f"[providers.claude.env]\nHOME = {q(str(tmp_path / 'claude-home'))}\n"
        "[providers.acp.missing]\ncommand = [\"agentd-no-such-agent\"]\n"
        f"[providers.acp.models]\ncommand = [{q(sys.executable)}, {q(str(AGENT))}]\nstartup_timeout_s = 10.0\n"
    )


def test_providers_states_each_with_its_fix_in_80_columns(tmp_path: Path) -> None:
    d = Daemon(tmp_path, _config(tmp_path, scripts_dir=str(tmp_path / "no-scripts"))).start()
    try:
        out = d.agentctl("providers")
        assert out.returncode == 0, out.stderr
        assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout
        body = json.loads(d.agentctl("providers", "--json").stdout)
        by = {p["name"]: p for p in body["providers"]}
        assert {n: p["state"] for n, p in by.items()} == {
            "script": "misconfigured", "copilot": "not_installed", "claude": "needs_sign_in",
            "acp:missing": "not_installed", "acp:models": "available"}, by
        assert by["acp:models"]["available"] is True and by["acp:models"]["fix"] == ""
        assert by["claude"]["available"] is False and by["claude"]["fix"] == "agentctl login claude"
        assert by["claude"]["account"]["signed_in"] is False and by["claude"]["account"]["env_var"] == KEY
        assert by["copilot"]["fix"] == "npm install -g @github/copilot, or fix providers.copilot.cli_path (agentd check-config)"
        assert by["script"]["fix"] == f"mkdir -p {tmp_path / 'no-scripts'}"
        assert "agentd-no-such-agent" in by["acp:missing"]["fix"]
        for p in by.values():  # the narrow table prints each fix under its provider (a long one: where to see it)
            fix = f"  fix: {p['fix']}" if len(p["fix"]) <= 74 else f"  fix: agentctl providers show {p['name']}"
            assert not p["fix"] or fix in out.stdout.splitlines(), (fix, out.stdout)
            assert "capabilities" in p and isinstance(p["capabilities"]["cancel"], bool)
        cut = [line for line in out.stdout.splitlines() if line.startswith("  why: ") and line.endswith("…")]
        assert cut  # some reasons here are longer than a line: the output says where they are whole
        assert out.stdout.splitlines()[-1].startswith("(cut to 80 columns: agentctl providers --wide")
        wide = d.agentctl("providers", "--wide")
        assert wide.returncode == 0 and "SUPPORTS" in wide.stdout and "set_model" in wide.stdout
        shown = d.agentctl("providers", "show", "claude")
        assert shown.returncode == 0 and "state:        needs_sign_in" in shown.stdout
        assert json.loads(d.agentctl("providers", "show", "claude", "--json").stdout)["state"] == "needs_sign_in"
        assert d.agentctl("providers", "show", "nope").returncode == 6
    finally:
        d.stop()


def test_claude_account_login_logout_and_quota(tmp_path: Path) -> None:
    d = Daemon(tmp_path, _config(tmp_path)).start()
    try:
        out = d.agentctl("account", "claude")
        assert out.returncode == 4 and "agentctl login claude" in out.stdout, (out.stdout, out.stderr)
        login = d.agentctl("login", "claude")
        assert login.returncode == 0, login.stderr
        assert f"CLAUDE_CONFIG_DIR={tmp_path / 'claude-config'} {_claude_cli()} auth login" in login.stdout
        assert f"export {KEY}=<key>" in login.stdout
        logout = d.agentctl("--json", "logout", "claude")  # nothing stored: Claude Code's logout still answers
        assert logout.returncode == 0, logout.stderr
        assert json.loads(logout.stdout)["account"]["signed_in"] is False
        assert d.agentctl("quota", "claude").returncode == 1  # Claude Code reports no account quota
        assert d.agentctl("login", "acp:models").returncode == 1
    finally:
        d.stop()
    d = Daemon(tmp_path, _config(tmp_path), env={KEY: "sk-agentd-test-not-a-key"}).start()
    try:
        out = d.agentctl("--json", "account", "claude")
        assert out.returncode == 0, out.stderr
        acct = json.loads(out.stdout)["accounts"][0]["account"]
        assert acct["signed_in"] is True and acct["source"] == "api_key" and acct["env_var"] == KEY
        assert "sk-agentd-test-not-a-key" not in out.stdout
        by = {p["name"]: p for p in json.loads(d.agentctl("providers", "--json").stdout)["providers"]}
        assert by["claude"]["state"] == "available" and by["claude"]["available"] is True
        refused = d.agentctl("logout", "claude")  # the key is agentd's environment's, not Claude Code's to forget
        assert refused.returncode == 8 and KEY in refused.stderr
    finally:
        d.stop()


def test_codex_signs_in_with_an_api_key_and_out_through_the_real_app_server(tmp_path: Path) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    config = ("[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
              f"[providers.codex]\ncli_path = {q(_codex_cli())}\ncodex_home = {q(str(home))}\nmodel = \"my-endpoint-model\"\n")
    d = Daemon(tmp_path, config).start()
    try:
        before = json.loads(d.agentctl("providers", "show", "codex", "--json").stdout)
        assert before["state"] == "needs_sign_in" and before["fix"] == "agentctl login codex", before
        assert before["capabilities"]["sign_in"] is True and before["capabilities"]["device_sign_in"] is True
        # ChatGPT's device sign-in needs OpenAI's server, which Codex cannot be pointed at: offline the
        # app-server refuses to start it, and agentd reports its reason (the command path, no stand-in).
        device = d.agentctl("login", "codex", "--device")
        assert device.returncode == 8 and "device code" in device.stderr, (device.stdout, device.stderr)
        signed = d.agentctl("--json", "login", "codex", "--with-token", input="sk-agentd-test-codex-key\n")
        assert signed.returncode == 0, signed.stderr
        assert json.loads(signed.stdout)["account"] == {"signed_in": True, "login": "", "source": "stored",
                                                        "env_var": "", "message": f"API key stored by Codex in {home}",
                                                        "host": ""}
        assert "sk-agentd-test-codex-key" not in d.log.read_text()
        assert json.loads(d.agentctl("providers", "show", "codex", "--json").stdout)["state"] == "available"
        out = d.agentctl("logout", "codex")
        assert out.returncode == 0 and "signed out" in out.stdout, out.stderr
        assert d.agentctl("account", "codex").returncode == 4
        listed = json.loads(d.agentctl("--json", "models", "codex").stdout)["models"]
        assert listed[-1]["id"] == "my-endpoint-model" and len(listed) > 1  # model/list's, then the configured one
        assert all(m["efforts"] for m in listed[:-1])
    finally:
        d.stop()


def test_catalogs_carry_efforts_context_tiers_and_cost_and_new_checks_the_tier(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "tiers.toml").write_text(
        '[[models]]\nid = "fast"\nname = "Fast"\nefforts = ["low", "high"]\ncost_tier = "low"\n'
        '[[models]]\nid = "deep"\ncontext_tiers = [{ id = "200k", tokens = 200000 }, { id = "1m", tokens = 1000000 }]\n'
        '[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "ok"\n')
    d = Daemon(tmp_path, _config(tmp_path, scripts_dir=str(scripts))).start()
    try:
        claude = {m["id"]: m for m in json.loads(d.agentctl("--json", "models", "claude").stdout)["models"]}
        assert [t["id"] for t in claude["sonnet"]["context_tiers"]] == ["200k", "1m"]
        assert claude["haiku"]["cost_tier"] == "low" and "max" in claude["opus"]["efforts"]
        assert "claude-test-model" in claude  # the configured model
        table = d.agentctl("models", "claude")
        assert table.returncode == 0 and "CONTEXT" in table.stdout and "200k,1m" in table.stdout
        bad = d.agentctl("new", "-p", "claude", "-m", "haiku", "--context-tier", "1m", "--cwd", str(work))
        assert bad.returncode == 8 and "allowed: 200k" in bad.stderr, bad.stderr
        unknown = d.agentctl("new", "-p", "claude", "-m", "gpt-9", "--cwd", str(work))
        assert unknown.returncode == 8 and "sonnet" in unknown.stderr
        listed = json.loads(d.agentctl("--json", "models", "script").stdout)["models"]
        assert [(m["id"], m["efforts"], m["cost_tier"]) for m in listed] == [("fast", ["low", "high"], "low"),
                                                                              ("deep", [], "")]
        cid = json.loads(d.agentctl("--json", "new", "-p", "script", "-m", "fast", "--effort", "high",
                                    "--cwd", str(work)).stdout)["id"]
        assert d.agentctl("run", "-p", "script", "-m", "deep", "--context-tier", "9m", "--cwd", str(work),
                          "x").returncode == 8
        refused = d.agentctl("set-model", cid, "fast", "--effort", "max")
        assert refused.returncode == 8 and "low, high" in refused.stderr
        assert d.agentctl("set-model", cid, "deep", "--context-tier", "1m").returncode == 0
        assert d.agentctl("send", cid, "go", "--follow").returncode == 0
        received = [json.loads(x) for x in (d.state_dir / "providers" / "script" / "received.jsonl").read_text().splitlines()]
        assert {k: received[-1].get(k) for k in ("model", "context_tier")} == {"model": "deep", "context_tier": "1m"}
        assert d.record(cid)["context_tier"] == "1m"
    finally:
        d.stop()
