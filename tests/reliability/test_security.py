"""Who gets in and what leaks: private files, other uids refused, the WebSocket's token and
Origin, a secrets canary through every output, ACP file access confined to the workdir."""

from __future__ import annotations

import json
import os
import re
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import trio
from trio_websocket import HandshakeError, open_websocket_url

from agentd import wire
from daemon_harness import REPO, Daemon, drive_pty
from environment import unavailable

from .conftest import ECHO, fast_daemon, log_events, new, run_turn, turn_state, wait_for
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_runtime_and_socket_files_are_private(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, ECHO)
        client.subscribe(cid)
        run_turn(client, cid, "hello")
    conv = daemon.state_dir / "conversations" / cid
    assert _mode(daemon.socket) == 0o600
    assert _mode(daemon.runtime_dir) == 0o700
    for d in (daemon.state_dir, daemon.state_dir / "conversations", conv):
        assert _mode(d) == 0o700, d
    for f in (conv / "events.jsonl", conv / "record.json", conv / "lease.json", daemon.state_dir / "agentd.lock",
              daemon.state_dir / "providers" / "script" / "received.jsonl"):
        assert _mode(f) == 0o600, f


# --------------------------------------------------------------------------- another uid


#: Runs as the other user: connect, print what happened as one JSON line (standard library only).
_PROBE = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(json.dumps({"connect": e.__class__.__name__, "errno": e.errno})); sys.exit()
data = b""
try:
    s.sendall(b'{"id": 0, "op": "hello", "protocol": 1}\n{"id": 1, "op": "ls"}\n')
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except OSError as e:
    pass
print(json.dumps({"connect": "ok", "received": data.decode(errors="replace")}))
"""


def _probe_as(user: pwd.struct_passwd, sock: Path) -> dict:
    proc = subprocess.run(["/usr/bin/python3", "-c", _PROBE, str(sock)], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_another_uid_cannot_reach_the_socket_and_is_refused_and_logged_when_it_does(
    other_user: pwd.struct_passwd,
) -> None:
    # A root the other user can traverse: only the runtime dir's own mode keeps it out.
    root = Path(tempfile.mkdtemp(prefix="agentd-uid-", dir="/tmp"))
    os.chmod(root, 0o755)
    d = fast_daemon(root).start()
    try:
        FAULTS["connection from another uid"] += 2
        # As installed: the 0700 directory refuses the other user before agentd is even asked.
        got = _probe_as(other_user, d.socket)
        assert got == {"connect": "PermissionError", "errno": 13}, got
        # Permissions loosened by mistake: agentd itself checks the peer's uid and refuses.
        os.chmod(d.runtime_dir, 0o755)
        os.chmod(d.socket, 0o666)
        got = _probe_as(other_user, d.socket)
        assert got["connect"] == "ok"
        frames = [msgspec.json.decode(line) for line in got["received"].splitlines()]
        assert len(frames) == 1, frames  # no hello, no listing: one error, then the connection closes
        err = frames[0]
        assert err["type"] == "error" and err["error"]["code"] == "unauthorized"
        assert f"uid {other_user.pw_uid}" in err["error"]["message"]
        refused = [e for e in log_events(d) if e.get("event") == "server.peer_refused"]
        assert refused and f"uid {other_user.pw_uid}" in refused[0]["peer"]
        # And our own uid still gets in.
        with d.client() as client:
            assert client.request(wire.Status)["pid"] == d.proc.pid
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- WebSocket gateway


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Daemon, int, str]]:
    port = _free_port()
    d = fast_daemon(tmp_path, f"[websocket]\nenabled = true\nport = {port}\n").start()

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(listening)  # the gateway starts just after the Unix socket
    try:
        yield d, port, (d.runtime_dir / "ws-token").read_text().strip()
    finally:
        d.stop()


@pytest.mark.parametrize(
    "path, headers, status",
    [
        ("/", [], 401),
        ("/", [(b"Authorization", b"Bearer")], 401),
        ("/", [(b"Authorization", b"Basic dXNlcjpwYXNz")], 401),
        ("/?token=wrong", [], 401),
        ("/", [(b"Authorization", b"Bearer {token}x")], 401),
        ("/", [(b"Authorization", b"Bearer {token}"), (b"Origin", b"https://evil.example")], 403),
        ("/", [(b"Authorization", b"Bearer {token}"), (b"Origin", b"null")], 403),
        ("/", [(b"Authorization", b"Bearer {token}"), (b"Origin", b"http://127.0.0.1.evil.example:{port}")], 403),
        ("/", [(b"Authorization", b"Bearer {token}"), (b"Origin", b"https://127.0.0.1:{port}")], 403),
        ("/?token={token}", [(b"Origin", b"http://localhost:1")], 403),
    ],
    ids=["none", "empty", "basic", "query-wrong", "token-suffix", "foreign-origin", "null-origin",
         "lookalike-origin", "https-origin", "other-port"],
)
async def test_the_gateway_refuses_without_the_token_or_from_a_foreign_origin_and_logs_it(
    gateway: tuple[Daemon, int, str], path: str, headers: list[tuple[bytes, bytes]], status: int
) -> None:
    d, port, token = gateway
    fill = lambda b: b.replace(b"{token}", token.encode()).replace(b"{port}", str(port).encode())  # noqa: E731
    headers = [(k, fill(v)) for k, v in headers]
    url = f"ws://127.0.0.1:{port}" + path.replace("{token}", token)
    FAULTS["websocket refused"] += 1
    with pytest.raises(HandshakeError) as err:
        async with open_websocket_url(url, extra_headers=headers):
            pass
    assert getattr(err.value, "status_code", None) == status
    await trio.sleep(0.1)
    refused = [e for e in log_events(d) if e.get("event") == "gateway.refused"]
    assert refused, "a refusal must be logged"
    assert token not in d.log.read_text(), "the token leaked into the log"


# --------------------------------------------------------------------------- secrets canary


CANARY_KEY = "sk-canary-3f9a1c7e5b2d4f608e1a9c3b7d5f2e4a"  # an API key in agentd's and an ACP agent's env
CANARY_BYOK = "byok-canary-5e8d2a7c1f4b9e3d6a0c"  # the Copilot bring-your-own-key (byok.api_key_env)
CANARY_ENV = "canary-agent-env-7c1e9b3a5d2f4e6a8b0c"  # a value in an ACP agent's configured env
CANARY_CLI = "canary-agentctl-env-1a2b3c4d5e6f7a8b9c0d"  # in the environment agentctl sends prompts from
CANARY_GH = "ghp_canary0GitHubToken9b8c7d6e5f4a3b2c1d"  # GH_TOKEN in agentd's environment (well-known name)
CANARY_PW = "canary-password-4d3c2b1a0f9e8d7c"  # MY_SERVICE_PASSWORD in agentd's environment (suffix rule)
CANARY_BEARER = "eyJcanary.bearer-token_6f5e4d3c2b1a"  # only ever seen after "Authorization: Bearer"
CANARY_HEADER = "xkey-canary-0a9b8c7d6e5f4a3b"  # only ever seen as an X-Api-Key header value


def _copilot_cli() -> str:
    """The Copilot CLI of the e2e tests, installed (once, under their lock) if need be."""
    if str(REPO / "tests" / "e2e") not in sys.path:
        sys.path.insert(0, str(REPO / "tests" / "e2e"))
    from installs import install_copilot_cli  # tests/e2e/installs.py

    try:
        return str(install_copilot_cli())
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"the Copilot CLI could not be installed: {exc}")


def _codex_cli() -> str:
    """The Codex CLI of the e2e tests (tests/e2e/package-lock.json), installed if need be."""
    from installs import install_codex_cli  # tests/e2e/installs.py, on sys.path after _copilot_cli()

    try:
        return str(install_codex_cli())
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"the Codex CLI could not be installed: {exc}")


def test_secrets_canary_appears_in_no_journal_log_frame_export_or_runtime_env(tmp_path: Path) -> None:
    """Secrets agentd knows of, and header values, echoed by an agent every way it can (text
    split across deltas, a thought, a tool's title, input and output, a plan, a title, stderr),
    reach no journal, state file, log line, subscriber frame, export or `--json` output; an ACP
    agent's environment holds no Copilot bring-your-own-key."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("nothing secret here\n")
    cli = _copilot_cli()  # also puts tests/e2e on sys.path
    from modelserver import ModelServer  # the scripted OpenAI-compatible model server of the e2e tests

    model_server = ModelServer(tmp_path / "model-requests.jsonl", model="canary-model")
    model_server.start()
    home = tmp_path / "copilot-home"
    home.mkdir()
    leak_file, env_dump = tmp_path / "leak.json", tmp_path / "agent-env.json"
    copilot = (f'[providers.copilot]\nenabled = true\ncli_path = {json.dumps(cli)}\ncopilot_home = {json.dumps(str(home))}\n'
               f'[providers.copilot.byok]\ntype = "openai"\nbase_url = {json.dumps(model_server.url)}\n'
               f'api_key_env = "AGENTD_CANARY_BYOK"\nmodel = "canary-model"\n')
    # Codex keeps its CODEX_HOME under the state dir by default: what it writes there is scanned too.
    codex = (f'[providers.codex]\ncli_path = {json.dumps(_codex_cli())}\nmodel = "canary-model"\n'
             'overrides = ["features.plugins=false", "analytics.enabled=false"]\n'
             f'[providers.codex.model_provider]\nbase_url = {json.dumps(model_server.url)}\n'
             'api_key_env = "AGENTD_CANARY_BYOK"\nrequest_max_retries = 0\nstream_max_retries = 0\n')
    port = _free_port()
    config = codex + f"""
[log]
level = "debug"
[websocket]
enabled = true
port = {port}
[providers.acp.fault]
command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]
env = {{ FAULT_TOKEN = {json.dumps(CANARY_ENV)}, OPENAI_API_KEY = {json.dumps(CANARY_KEY)}, FAULT_LEAK_FILE = {json.dumps(str(leak_file))}, FAULT_ENV_DUMP = {json.dumps(str(env_dump))} }}
"""
    root = tmp_path / "d"
    root.mkdir()
    d = Daemon(root, copilot + "[providers.claude]\nenabled = false\n" + config,
               env={"AGENTD_CANARY_BYOK": CANARY_BYOK, "OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY,
                    "GH_TOKEN": CANARY_GH, "MY_SERVICE_PASSWORD": CANARY_PW})
    d.start(timeout=60)
    gateway_token = wait_for(lambda: (d.runtime_dir / "ws-token").is_file() and (d.runtime_dir / "ws-token").read_text().strip())
    leak_file.write_text(json.dumps([
        CANARY_BYOK, CANARY_KEY, CANARY_ENV, CANARY_GH, CANARY_PW, gateway_token,
        f"Authorization: Bearer {CANARY_BEARER}", f"curl -H 'X-Api-Key: {CANARY_HEADER}' https://example.test",
    ]))
    canaries = (CANARY_KEY, CANARY_BYOK, CANARY_ENV, CANARY_CLI, CANARY_GH, CANARY_PW, CANARY_BEARER, CANARY_HEADER,
                gateway_token)
    outputs: list[str] = []

    def ctl(*args: str, ok: bool = True) -> str:
        env = {**d.env, "AGENTD_CANARY": CANARY_CLI, "OPENAI_API_KEY": CANARY_CLI, "GITHUB_TOKEN": CANARY_CLI}
        proc = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), *args], env=env,
                              capture_output=True, text=True, timeout=120, cwd=work)
        outputs.extend([proc.stdout, proc.stderr])
        if ok:
            assert proc.returncode == 0, proc.stderr
        return proc.stdout

    try:
        FAULTS["secrets canary"] += 1
        ctl("providers", "--json")
        ctl("status", "--json")
        out = ctl("run", "--provider", "script", "--model", str(ECHO), "--cwd", str(work), "--json", "hello there")
        cid = json.loads(out.strip().splitlines()[-1])["conversation"]
        ctl("show", cid, "--json")
        ctl("ls", "--all", "--json")
        ctl("export", cid, "--format", "json", ok=False)
        out = ctl("run", "--provider", "acp:fault", "--cwd", str(work), "--json", "read notes.txt")
        acp = json.loads(out.strip().splitlines()[-1])["conversation"]
        # The agent echoes every secret while a subscriber watches live (deltas included).
        with d.client() as client:
            client.subscribe(acp, after=0)
            run = client.request(wire.Send, conversation=acp, text="leak")["run"]
            live = client.follow(run, timeout=60)
        outputs.extend(bytes(r.data).decode() for r in live)
        deltas = "".join(msgspec.json.decode(r.data)["text"] for r in live if r.type == "delta")
        assert deltas.count("[redacted]") >= 3 * 8, deltas  # each value twice in text, once a character a chunk
        for fmt in ("md", "json", "html"):
            ctl("export", acp, "--format", fmt, "--include-tools")
        ctl("show", acp, "--json")
        ctl("tail", acp, "--after", "0", "--no-follow")
        ctl("run", "--provider", "acp:fault", "--cwd", str(work), "--json", "crash", ok=False)  # a failed turn
        ctl("send", "no-such-conversation", "hi", "--json", ok=False)  # an error
        ctl("models", "--provider", "copilot", "--json", ok=False)
        # A real Copilot CLI turn on the bring-your-own-key endpoint: the key is read and used.
        model_server.answer_text_only()
        out = ctl("run", "--provider", "copilot", "--cwd", str(work), "--json", "say hi")
        assert json.loads(out.strip().splitlines()[-1])["state"] == "completed"
        assert model_server.model_requests, "the Copilot CLI never called the model: the canary proves nothing"
        # A real Codex turn that runs a shell command (yolo), on the same endpoint with the same key.
        model_server.reset()
        model_server.call_tool("exec_command", arguments={"cmd": "echo codex-ran > codex.txt", "login": False,
                                                          "sandbox_permissions": "require_escalated"})
        before = len(model_server.requests)
        out = ctl("run", "--provider", "codex", "--cwd", str(work), "--yolo", "--json", "run it")
        assert json.loads(out.strip().splitlines()[-1])["state"] == "completed"
        assert len(model_server.requests) >= before + 2 and (work / "codex.txt").exists()
        with d.client() as client:
            for conv in (cid, acp):
                client.subscribe(conv, after=0)
                for frame in client.frames(timeout=10):
                    outputs.append(repr(frame))
                    if isinstance(frame, wire.SnapshotFrame):
                        break
    finally:
        d.stop()
        model_server.stop()
    agent_env = json.loads(env_dump.read_text())
    assert "AGENTD_CANARY_BYOK" not in agent_env and CANARY_BYOK not in env_dump.read_text(), \
        "the Copilot bring-your-own-key reached an ACP agent's environment"
    assert agent_env.get("FAULT_TOKEN") == CANARY_ENV, "the agent's own configured env must reach it"
    journal = (d.state_dir / "conversations" / acp / "events.jsonl").read_text()
    assert journal.count("[redacted]") >= 8 * 6, "the agent's echoes were masked, not dropped"
    assert "debug: using [redacted]" in d.log.read_text(), "the agent's stderr is relayed to the log, masked"
    leaks = []
    for canary in canaries:
        for path in [d.log, d.config.parent / "agentd.log", *d.state_dir.rglob("*")]:
            if path.is_file() and canary.encode() in path.read_bytes():
                leaks.append(f"{canary[:12]}... in {path}")
        for n, text in enumerate(outputs):
            if canary in text:
                leaks.append(f"{canary[:12]}... in output {n}: {text[:200]!r}")
    assert not leaks, "\n".join(leaks)



def test_a_secret_in_a_tool_output_too_big_for_the_journal_is_masked_in_the_whole_output_kept_on_disk(
    tmp_path: Path,
) -> None:
    """The whole output of a tool (kept beside the journal when the record holds a display cut) is
    masked before it is written: no state file, `show --item --full` page or export holds the secret."""
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "echo-secret.toml"
    # ~270 KB: the secret lies in the middle, in what the display cut leaves out.
    script.write_text('model = "leak"\n[[turn]]\n[[turn.step]]\nkind = "tool"\nname = "bash"\n'
                      'command = "seq 1 30000; echo \\"pw=$MY_SERVICE_PASSWORD\\"; seq 1 30000"\n'
                      '[[turn.step]]\nkind = "text"\ntext = "done"\n')
    d = fast_daemon(tmp_path / "d", env={"MY_SERVICE_PASSWORD": CANARY_PW}).start()
    try:
        FAULTS["secrets canary"] += 1
        with d.client() as client:
            cid = new(client, work, script)
            client.subscribe(cid)
            assert turn_state(run_turn(client, cid, "go")[-1]) == "completed"
        tool = [r["data"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"][-1]
        assert tool["tool"].get("cut", 0) > 0 and "pw=" not in tool["tool"]["output"]  # the display cut left it out
        full = d.agentctl("show", cid, "--item", tool["id"], "--full")
        exported = d.agentctl("export", cid, "--include-tools")
        for proc in (full, exported):
            assert proc.returncode == 0, proc.stderr
            assert "pw=[redacted]" in proc.stdout and CANARY_PW not in proc.stdout
        kept = [p for p in d.state_dir.rglob("*") if p.is_file() and CANARY_PW.encode() in p.read_bytes()]
        assert kept == [], f"the secret is in clear in {kept}"
        assert list(d.state_dir.glob(f"conversations/{cid}/tool-output/*.txt")), "no whole output was kept"
    finally:
        d.stop()


def test_a_runtime_gets_no_other_providers_sign_in_variable_unless_it_passes_it_on(tmp_path: Path) -> None:
    """COPILOT_GITHUB_TOKEN, ANTHROPIC_AUTH_TOKEN and CODEX_API_KEY (each read by one runtime only) and
    the providers' key variables reach no ACP agent unless it lists them in pass_env."""
    work = tmp_path / "work"
    work.mkdir()
    dumps = {name: tmp_path / f"env-{name}.json" for name in ("plain", "passing")}
    agents = "".join(
        f'[providers.acp.{name}]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]\n'
        f'env = {{ FAULT_ENV_DUMP = {json.dumps(str(dump))} }}\n'
        + ('pass_env = ["ANTHROPIC_AUTH_TOKEN"]\n' if name == "passing" else "")
        for name, dump in dumps.items())
    claimed = {"COPILOT_GITHUB_TOKEN": "copilot-sign-in-canary-1a2b3c", "ANTHROPIC_AUTH_TOKEN": "claude-auth-canary-4d5e6f",
               "CODEX_API_KEY": "codex-key-canary-7a8b9c", "ANTHROPIC_API_KEY": CANARY_KEY}
    # The Copilot, Claude and Codex providers are enabled (the default): each claims its variables.
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", agents, env={**claimed, "UNCLAIMED_TOKEN": "kept-for-every-runtime"}).start(timeout=60)
    try:
        FAULTS["secrets canary"] += 1
        with d.client() as client:
            for name in dumps:
                cid = client.request(wire.New, provider=f"acp:{name}", workdir=str(work))["id"]
                client.subscribe(cid)
                assert turn_state(run_turn(client, cid, "hello", timeout=60)[-1]) == "completed"
    finally:
        d.stop()
    plain, passing = (json.loads(dumps[n].read_text()) for n in ("plain", "passing"))
    assert plain["UNCLAIMED_TOKEN"] == passing["UNCLAIMED_TOKEN"] == "kept-for-every-runtime"
    assert not set(claimed) & set(plain), sorted(set(claimed) & set(plain))
    assert passing["ANTHROPIC_AUTH_TOKEN"] == claimed["ANTHROPIC_AUTH_TOKEN"]
    assert not {"COPILOT_GITHUB_TOKEN", "CODEX_API_KEY", "ANTHROPIC_API_KEY"} & set(passing)

# --------------------------------------------------------------------------- ACP file access


@pytest.fixture
def acp_daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = f"""
[providers.acp.fault]
command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]
"""
    d = fast_daemon(tmp_path / "d", config).start()
    try:
        yield d
    finally:
        d.stop()


def test_acp_file_requests_outside_the_workdir_are_refused_symlinks_and_dotdot_included(
    acp_daemon: Daemon, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (work / "inside.txt").write_text("inside\n")
    (work / "link-out").symlink_to(outside)  # a directory symlink pointing out
    (work / "secret-link.txt").symlink_to(outside / "secret.txt")  # a file symlink pointing out
    (work / "sub" / "up").symlink_to("../..")  # relative, climbing out
    refused_reads = [
        "../outside/secret.txt",
        str(outside / "secret.txt"),
        "link-out/secret.txt",
        "secret-link.txt",
        "sub/up/outside/secret.txt",
        "sub/../../outside/secret.txt",
        "/etc/passwd",
        "/proc/self/environ",
    ]
    refused_writes = ["../outside/new.txt", "link-out/new.txt", "sub/up/outside/new.txt", str(outside / "abs.txt"),
                      "secret-link.txt"]
    with acp_daemon.client() as client:
        cid = client.request(wire.New, provider="acp:fault", workdir=str(work))["id"]
        client.subscribe(cid)

        def reply(prompt: str) -> str:
            records = run_turn(client, cid, prompt)
            texts = [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]
            return next(t for t in reversed(texts) if t.startswith(("ok", "error")))

        assert reply("read inside.txt") == "ok:inside\n"
        assert reply(f"read {work / 'inside.txt'}") == "ok:inside\n"
        for path in refused_reads:
            FAULTS["acp fs escape"] += 1
            answer = reply(f"read {path}")
            assert answer.startswith("error:") and "outside" in answer, (path, answer)
            assert "top secret" not in answer
        for path in refused_writes:
            FAULTS["acp fs escape"] += 1
            answer = reply(f"write {path} pwned")
            assert answer.startswith("error:"), (path, answer)
        assert reply("write sub/new.txt fine") == "ok"
    assert (work / "sub" / "new.txt").read_text() == "fine"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


# --------------------------------------------------------------------------- terminal safety


#: Cursor up + erase line + a fake permission line, OSC 52 (clipboard), OSC 0 (window title),
#: a C1 CSI (U+009B), DEL, BEL, backspace and a bare carriage return.
NASTY = "A\x1b[1A\r\x1b[2Kallowed: ls\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x07\x9b31mred\x7f\x08B"
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _nasty_script(path: Path) -> Path:
    n = json.dumps(NASTY)  # JSON's \u escapes are TOML basic-string escapes too
    said, output = json.dumps("say " + NASTY + " end"), json.dumps(NASTY + "\n" + NASTY)
    path.write_text(f"""
model = "nasty"
delay_ms = 0
chunk = 3

[[turn]]
match = "show"
[[turn.step]]
kind = "reasoning"
text = {n}
[[turn.step]]
kind = "text"
text = {said}
[[turn.step]]
kind = "tool"
name = "bash"
title = {n}
input = {n}
output = {output}
[[turn.step]]
kind = "todos"
todo = [{{ title = {n} }}]
[[turn.step]]
kind = "title"
title = {n}
[[turn.step]]
kind = "question"
title = {n}
header = {n}
text = {n}
choices = [{n}, "plain"]
[[turn.step]]
kind = "tool"
name = "deploy"
title = {n}
input = {n}
output = "deployed"
permission = true
[[turn.step]]
kind = "text"
text = "done"

[[turn]]
match = "fail"
[[turn.step]]
kind = "fail"
error = {n}
""")
    return path


def test_agent_text_reaches_no_terminal_with_live_control_characters(daemon: Daemon, workdir: Path,
                                                                     tmp_path: Path) -> None:
    """Control sequences an agent puts in every field (text split across deltas, reasoning, tool
    title, input and output, todos, title, question, permission, a failure) are shown visibly by
    `agentctl` run, tail, show, ls, answer, attach at a terminal, and the Markdown and HTML exports."""
    script = _nasty_script(tmp_path / "nasty.toml")
    FAULTS["terminal control sequences"] += 1
    outputs: dict[str, str] = {}

    def ctl(name: str, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), *args],
                              env=daemon.env, capture_output=True, timeout=60, cwd=workdir)
        outputs[name] = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        return outputs[name]

    cid = json.loads(ctl("new", "new", "-p", "script", "-m", str(script), "--cwd", str(workdir), "--json"))["id"]
    ctl("run", "send", cid, "show", "--follow", "--exit-on-action")  # stops at the question (exit 4)
    wait_for(lambda: daemon.record(cid)["state"] == "requires_action")
    ctl("show", "show", cid)
    tool_item = next(r["data"]["id"] for r in daemon.journal(cid)
                     if r["type"] == "item" and (r["data"].get("tool") or {}).get("name") == "bash")
    ctl("show item", "show", cid, "--item", tool_item)
    ctl("show item full", "show", cid, "--item", tool_item, "--full")
    ctl("ls", "ls")
    ctl("tail", "tail", cid, "--after", "0", "--no-follow", "--seq")
    ctl("answer", "answer", cid, "--choice", "1")
    wait_for(lambda: daemon.record(cid)["state"] == "requires_action")  # the permission
    code, outputs["attach (terminal)"] = drive_pty(
        [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "attach", cid, "--until-idle"],
        daemon.env, workdir, [("choose 1-", "1")], timeout=30)
    assert code == 0, outputs["attach (terminal)"]
    ctl("fail", "send", cid, "fail", "--follow")
    ctl("tail after", "tail", cid, "--after", "0", "--no-follow")
    ctl("export md", "export", cid, "--format", "md", "--include-tools")
    ctl("export html", "export", cid, "--format", "html", "--include-tools")
    raw = []
    for name, text in outputs.items():
        if name == "attach (terminal)":
            text = text.replace("\r\n", "\n")  # the terminal's own line ends (onlcr)
            # agentctl's own live view: lines redrawn in place (CR, erase line, cursor up) and the
            # bell when the question waits; agent text shows its controls visibly (checked below)
            text = re.sub(r"\r?(\x1b\[1A)?\r?\x1b\[2K|\a", "", text)
        found = sorted({f"{ord(ch):#04x}" for ch in _RAW_CONTROL.findall(text)})
        if found:
            raw.append(f"{name}: raw {', '.join(found)} in {text[:300]!r}")
    assert not raw, "\n".join(raw)
    shown = [name for name, text in outputs.items() if "\\x1b[1A" in text and "\\x9b31m" in text]
    assert set(shown) >= {"run", "show", "show item", "show item full", "tail", "answer", "attach (terminal)", "fail",
                          "tail after", "export md", "export html"}, shown
