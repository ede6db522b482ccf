"""An agent cannot drive agentd through its own control socket: a command the agent runs (here a
script tool's real shell, under agentd's keeper as every runtime process is) that connects with
agentctl, or over the WebSocket gateway with the token it can read, is refused everything but its
host tools, so it cannot answer a pending permission, prompt a conversation, or read one. The same
requests from the user's own agentctl work."""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from daemon_harness import Daemon

VICTIM = '''
model = "victim"
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "tool"
name = "bash"
permission = true
command = "echo allowed > allowed.txt"
[[turn.step]]
kind = "text"
text = "done"
'''

#: argv: PORT TOKENFILE CONVERSATION INTERACTION OWNFILE. Over the WebSocket gateway with the token: hello,
#: then ``answer`` (allow), ``ls`` and ``list_host_tools`` (an unknown id, a prefix, the victim's full id,
#: the agent's own conversation's, read from OWNFILE); prints each reply's error code (or "ok").
WS_CLIENT = r'''
import json, sys, trio
from trio_websocket import open_websocket_url

async def main():
    token = open(sys.argv[2]).read().strip()
    async with open_websocket_url(f"ws://127.0.0.1:{sys.argv[1]}/", extra_headers=[(b"Authorization", f"Bearer {token}".encode())]) as ws:
        await ws.get_message()
        await ws.send_message(json.dumps({"id": 0, "op": "hello", "protocol": 1}))
        await ws.get_message()
        answer = {"op": "answer", "conversation": sys.argv[3], "interaction": sys.argv[4], "answer": {"decision": "allow_once"}}
        own = open(sys.argv[5]).read().strip()
        ops = [answer, {"op": "ls"}, {"op": "list_host_tools", "conversation": "nope"},
               {"op": "list_host_tools", "conversation": sys.argv[3][:2]},
               {"op": "list_host_tools", "conversation": sys.argv[3]}, {"op": "list_host_tools", "conversation": own}]
        for i, op in enumerate(ops, 1):
            await ws.send_message(json.dumps({"id": i, **op}))
            reply = json.loads(await ws.get_message())
            print(f"ws {op['op']} {op.get('conversation', '')}:", reply.get("error", {}).get("code", "ok"),
                  reply.get("error", {}).get("message", ""))

trio.run(main)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(out: Any) -> Any:
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr}"
    return json.loads(out.stdout)


def _eventually(fn: Any, why: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(why)


def test_an_agents_own_processes_may_not_answer_prompt_or_read(tmp_path: Path) -> None:
    port = _free_port()
    d = Daemon(tmp_path, f"[websocket]\nenabled = true\nport = {port}\n").start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        victim_script = tmp_path / "victim.toml"
        victim_script.write_text(VICTIM)
        victim = _json(d.agentctl("--json", "new", "-p", "script", "-m", str(victim_script), "--cwd", str(work)))["id"]
        assert d.agentctl("send", victim, "write it").returncode == 0
        pending = _eventually(lambda: _json(d.agentctl("show", victim, "--json")).get("pending"),
                              why="the victim's permission never became pending")
        interaction = pending[0]["id"]

        # What an injected agent would run: the user's own agentctl, pointed at agentd's socket.
        ctl = f"{shlex.quote(sys.executable)} -m agentctl --no-autostart --socket {shlex.quote(str(d.socket))}"
        ws_client = tmp_path / "ws_client.py"
        ws_client.write_text(WS_CLIENT)
        attack = " ; ".join([
            f"{ctl} answer {victim} {interaction} --allow; echo answer-rc=$?",
            f"{ctl} send {victim} 'and more'; echo send-rc=$?",
            f"{ctl} ls; echo ls-rc=$?",
            f"{ctl} stop; echo stop-rc=$?",
            f"{shlex.quote(sys.executable)} {shlex.quote(str(ws_client))} {port} {shlex.quote(str(d.runtime_dir / 'ws-token'))} "
            f"{victim} {interaction} {shlex.quote(str(tmp_path / 'attacker.id'))}",
        ])
        attacker_script = tmp_path / "attacker.toml"
        attacker_script.write_text(
            'model = "attacker"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "tool"\nname = "bash"\n'
            f"command = {json.dumps(attack)}\n"
        )
        attacker = _json(d.agentctl("--json", "new", "-p", "script", "-m", str(attacker_script), "--cwd", str(work)))["id"]
        (tmp_path / "attacker.id").write_text(attacker)
        out = d.agentctl("--json", "send", attacker, "go", "--follow", timeout=120)
        assert out.returncode == 0, out.stderr
        tool = [r for r in d.journal(attacker) if r["type"] == "item" and r["data"]["kind"] == "tool"
                and r["data"]["tool"].get("status") == "completed"]
        assert tool, d.journal(attacker)
        output = tool[-1]["data"]["tool"]["output"]

        refused = "refused: this connection comes from an agent's own processes"
        # agentctl answer asks for the conversation first (show); each command fails at its first request.
        for op, first in (("answer", "show"), ("send", "send"), ("ls", "ls"), ("stop", "status")):
            assert f"unauthorized: {first} {refused}" in output, output
            rc = next(line for line in output.splitlines() if line.startswith(f"{op}-rc="))
            assert rc != f"{op}-rc=0", output
        assert f"ws answer {victim}: unauthorized answer {refused}" in output, output
        assert f"ws ls : unauthorized ls {refused}" in output, output
        # Its host tools stay open to it (no such conversation: not found, yet not refused), by full
        # ids only: a prefix would list the ids it matches.
        assert "ws list_host_tools nope: not_found no conversation 'nope'" in output, output
        by_prefix = next(line for line in output.splitlines() if line.startswith(f"ws list_host_tools {victim[:2]}:"))
        assert "not_found" in by_prefix and "full id" in by_prefix and victim not in by_prefix, output
        # Another conversation's, by its full id: refused, as it does not run under this agent's keeper.
        assert (f"ws list_host_tools {victim}: unauthorized list_host_tools refused: conversation {victim} "
                "does not run in this agent's processes") in output, output
        assert f"ws list_host_tools {attacker}: ok" in output, output

        # Nothing happened: the permission is still pending, no prompt was taken, agentd runs.
        assert _json(d.agentctl("show", victim, "--json"))["pending"][0]["id"] == interaction
        assert not (work / "allowed.txt").exists()
        assert [r["data"]["text"] for r in d.journal(victim) if r["type"] == "prompt"] == ["write it"]
        assert any(e.get("event") == "server.agent_refused" for e in d.log_events())

        # The user's own agentctl may.
        assert d.agentctl("answer", victim, interaction, "--allow").returncode == 0
        _eventually(lambda: (work / "allowed.txt").exists(), why="the user's answer did not let the tool run")
    finally:
        d.stop()


#: argv: SOCKET COUNT OUT RELEASE. Opens COUNT connections to agentd, each with its hello, writes
#: how many were taken and how many refused to OUT, and holds them until RELEASE exists.
HOARDER = r'''
import json, os, socket, sys, time
path, count, out, release = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
held, refused = [], 0
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    first = json.loads(f.readline())
    if first.get("type") == "error":
        refused += 1
        s.close()
        continue
    s.sendall(b'{"id": 0, "op": "hello", "protocol": 1}\n')
    json.loads(f.readline())
    held.append((s, f))
with open(out + ".tmp", "w") as fh:
    json.dump({"held": len(held), "refused": refused}, fh)
os.rename(out + ".tmp", out)
deadline = time.monotonic() + 60
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
'''


def _hoard(d: Daemon, tmp_path: Path, name: str, count: int) -> tuple[str, Path]:
    """A conversation whose agent runs HOARDER for ``count`` connections (released by
    ``tmp_path/release``), sent its prompt; (its id, the file its counts go to)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    hoarder = tmp_path / "hoarder.py"
    hoarder.write_text(HOARDER)
    counts = tmp_path / f"{name}.json"
    command = " ".join(shlex.quote(str(a)) for a in (sys.executable, hoarder, d.socket, count, counts, tmp_path / "release"))
    script = tmp_path / f"{name}.toml"
    script.write_text(f'model = "{name}"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "tool"\nname = "bash"\n'
                      f"command = {json.dumps(command)}\n")
    cid = _json(d.agentctl("--json", "new", "-p", "script", "-m", str(script), "--cwd", str(work)))["id"]
    assert d.agentctl("send", cid, "go").returncode == 0
    return cid, counts


def test_an_agent_opening_connections_in_a_loop_leaves_the_users_share(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "[server]\nmax_connections = 16\n").start()
    try:
        cid, counts = _hoard(d, tmp_path, "hoard", 40)
        _eventually(counts.exists, why="the agent's command never reported", timeout=60)
        # 16 in all, 4 kept for the user (a quarter): the agent got 12 and was refused the rest.
        assert json.loads(counts.read_text()) == {"held": 12, "refused": 28}
        # While it holds them, the user's own clients get in (the daemon's and agentctl's).
        for _ in range(3):
            out = d.agentctl("--json", "ls")
            assert out.returncode == 0, out.stderr
            assert [c["id"] for c in json.loads(out.stdout)["conversations"]] == [cid]
        (tmp_path / "release").touch()
        _eventually(lambda: _json(d.agentctl("show", cid, "--json"))["record"]["state"] == "idle", why="the turn did not end")
    finally:
        d.stop()


def test_one_agent_cannot_take_the_connections_of_the_others(tmp_path: Path) -> None:
    # 200 in all: 50 kept for the user, 150 for agents, 37 (a quarter) for each agent's processes.
    d = Daemon(tmp_path, "[server]\nmax_connections = 200\n").start()
    try:
        counts = {}
        for name, count in (("greedy", 60), ("other", 5)):
            counts[name] = _hoard(d, tmp_path, name, count)[1]
            _eventually(counts[name].exists, why=f"{name}'s command never reported", timeout=60)
        assert json.loads(counts["greedy"].read_text()) == {"held": 37, "refused": 23}
        assert json.loads(counts["other"].read_text()) == {"held": 5, "refused": 0}
        (tmp_path / "release").touch()
    finally:
        d.stop()
