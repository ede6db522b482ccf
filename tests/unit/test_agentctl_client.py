"""agentctl's socket client against a scripted peer: hello, errors, lagged resubscription.

The real daemon cannot be made to lag on demand, so a thread plays agentd's
side of the protocol on a real Unix socket, frame by frame.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentctl.client import Client, Unreachable, _daemon_said
from agentd import contract as c
from agentd import wire


def event(sub: int, seq: int, text: str = "x") -> wire.EventFrame:
    rec = wire.Record(type="title", ts="t", seq=seq, data=msgspec.Raw(msgspec.json.encode(text)))
    return wire.EventFrame(sub=sub, conversation="c1", record=msgspec.Raw(msgspec.json.encode(rec)))


class Peer:
    """Plays agentd: greets, then hands each request to ``script`` with a ``send``."""

    def __init__(self, path: Path, script: Callable[[Any, Callable[[Any], None]], None]) -> None:
        self.path = path
        self.requests: list[Any] = []
        self.errors: list[BaseException] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        self._script = script
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        f = conn.makefile("rb")

        def send(frame: Any) -> None:
            conn.sendall(frame if isinstance(frame, bytes) else wire.encode(frame))

        try:
            send(wire.HelloFrame(protocol=wire.PROTOCOL_VERSION, server="fake"))
            for line in f:
                req = wire.decode_request(line.rstrip(b"\n"))
                self.requests.append(req)
                if isinstance(req, wire.Hello):
                    send(wire.ResultFrame(id=0))
                    continue
                self._script(req, send)
        except ConnectionAbortedError:
            pass  # the script hangs up
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.errors.append(exc)
        finally:
            f.close()
            conn.close()
            self._listener.close()


def test_an_error_frame_raises_the_matching_contract_error(tmp_path: Path) -> None:
    def script(req: Any, send: Callable[[Any], None]) -> None:
        send(wire.ErrorFrame(id=req.id, error=wire.ErrorBody(code="busy", message="a turn runs")))

    Peer(tmp_path / "s", script)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        with pytest.raises(c.Busy, match="a turn runs"):
            client.call(wire.Send, wire.SendResult, conversation="c1", text="hi")


def test_a_refused_hello_is_raised(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(wire.encode(wire.HelloFrame(protocol=99, server="future")))
        conn.recv(4096)
        conn.sendall(wire.encode(wire.ErrorFrame(id=0, error=wire.ErrorBody(code="invalid", message="protocol mismatch"))))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(c.Invalid, match="protocol mismatch"):
        Client.connect(str(tmp_path / "s"), autostart=False)
    listener.close()


def test_no_socket_without_autostart_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(Unreachable, match="not running"):
        Client.connect(str(tmp_path / "missing.sock"), autostart=False)


def test_a_lagged_subscription_resumes_after_what_it_already_got_with_no_duplicate(tmp_path: Path) -> None:
    subs: list[wire.Subscribe] = []

    def script(req: Any, send: Callable[[Any], None]) -> None:
        if isinstance(req, wire.Subscribe):
            subs.append(req)
            send(wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode(
                wire.SubscribeResult(subscription=req.id, last_seq=3)))))
            if len(subs) == 1:
                send(event(req.id, 1))
                send(event(req.id, 2))
                # agentd's cursor may trail what reached the client
                send(wire.LaggedFrame(sub=req.id, conversation="c1", resume_after=1))
                send(event(req.id, 9))  # a straggler of the ended subscription
            else:
                send(event(req.id, 2))  # already delivered: dropped
                send(event(req.id, 3))
                send(wire.SnapshotFrame(sub=req.id, conversation="c1", snapshot=wire.Snapshot(
                    state=wire.ConversationState.IDLE, last_seq=3)))

    peer = Peer(tmp_path / "s", script)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        sub = client.subscribe("c1", after=0)
        got: list[Any] = []
        while True:
            frame = sub.get(timeout=5)
            assert frame is not None, "timed out"
            got.append(frame)
            if isinstance(frame, wire.SnapshotFrame):
                break
    seqs = [wire.decode_record(f.record).seq for f in got if isinstance(f, wire.EventFrame)]
    assert seqs == [1, 2, 3]
    assert [s.after for s in subs] == [0, 2]
    assert not peer.errors


def test_a_connection_lost_mid_stream_is_unreachable(tmp_path: Path) -> None:
    def script(req: Any, send: Callable[[Any], None]) -> None:
        send(wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode(
            wire.SubscribeResult(subscription=req.id)))))
        raise ConnectionAbortedError  # the peer goes away

    Peer(tmp_path / "s", script)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        sub = client.subscribe("c1")
        with pytest.raises(Unreachable):
            sub.get(timeout=5)
        with pytest.raises(Unreachable):
            client.call(wire.Status, wire.StatusResult)


def test_frames_split_across_reads_or_sharing_one_arrive_whole_and_in_order(tmp_path: Path) -> None:
    big = "x" * 300_000  # several reads of the client's reader

    def script(req: Any, send: Callable[[Any], None]) -> None:
        if isinstance(req, wire.Subscribe):
            result = wire.SubscribeResult(subscription=req.id, last_seq=3)
            frames = [wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode(result)))]
            send(b"".join(wire.encode(f) for f in [*frames, *(event(req.id, seq) for seq in (1, 2, 3))]))
            return
        data = wire.encode(wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode({"text": big}))))
        for a, b in zip([0, 1, 9, 70_000, 200_001], [1, 9, 70_000, 200_001, len(data)]):
            send(data[a:b])

    peer = Peer(tmp_path / "s", script)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        sub = client.subscribe("c1")
        seqs = [wire.decode_record(sub.get(timeout=5).record).seq for _ in range(3)]
        assert client.call(wire.Status, dict[str, str]) == {"text": big}
    assert seqs == [1, 2, 3]
    assert not peer.errors


def test_a_frame_over_the_client_limit_ends_the_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "CLIENT_MAX_FRAME_BYTES", 1000)

    def script(req: Any, send: Callable[[Any], None]) -> None:
        text = "x" * (1000 - len(wire.encode(wire.ResultFrame(id=req.id, result=msgspec.Raw(b'""')))) + 1)
        if isinstance(req, wire.Status):  # exactly at the limit: fine
            send(wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode(text))))
        else:  # one byte over
            send(wire.ResultFrame(id=req.id, result=msgspec.Raw(msgspec.json.encode(text + "x"))))

    Peer(tmp_path / "s", script)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        assert len(client.call(wire.Status, str)) > 900
        with pytest.raises(wire.ProtocolError, match="over the client limit"):
            client.call(wire.Providers)


def test_a_daemon_that_exits_at_start_is_quoted_from_its_part_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "agentd.log"
    log.write_text("agentd: an older error\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("\nagentd: /x/agentd.toml: unknown key daemon.foo\nagentd: /x/agentd.toml:3:1: second\n")
    assert _daemon_said(str(log), start) == [
        "agentd: /x/agentd.toml: unknown key daemon.foo",
        "agentd: /x/agentd.toml:3:1: second",
    ]
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("Traceback (most recent call last):\n" + "".join(f"  line {i}\n" for i in range(20)) + "Boom: x\n")
    said = _daemon_said(str(log), start)
    assert len(said) == 10 and said[-1] == "Boom: x"
    assert _daemon_said(str(tmp_path / "missing.log"), 0) == []


@pytest.mark.parametrize(
    "env",
    [
        {"AGENTD_SOCKET": "/run/x/my.sock"},
        {"AGENTD_SOCKET": "rel/my.sock"},
        {"AGENTD_RUNTIME_DIR": "/run/elsewhere"},
        {"AGENTD_RUNTIME_DIR": "rel-runtime", "XDG_RUNTIME_DIR": "/run/user/4242"},
        {"XDG_RUNTIME_DIR": "/run/user/4242"},
        {},
    ],
)
def test_default_socket_is_where_agentd_puts_it(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """agentctl's default socket follows the same environment as agentd's (config without paths)."""
    from agentctl.client import default_socket_path
    from agentd.config import Config

    monkeypatch.chdir(tmp_path)
    for key in ("AGENTD_SOCKET", "AGENTD_RUNTIME_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert default_socket_path() == str(Config().resolved_paths().socket)


def _blocked(tid: int) -> int:
    """The signal mask of thread ``tid`` of this process (SigBlk in /proc), as a bit set."""
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def test_only_the_main_thread_takes_ctrl_c(tmp_path: Path) -> None:
    """A process-directed SIGINT goes to any thread not blocking it: the reader blocks it, else
    Ctrl-C taken there would leave the main thread asleep in a reply's wait (CI: a `login --device`
    that Ctrl-C did not stop)."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    Peer(tmp_path / "s", lambda req, send: None)
    with Client.connect(str(tmp_path / "s"), autostart=False) as client:
        reader = client._reader.native_id
        assert reader is not None
        mask = _blocked(reader)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            assert mask & (1 << (sig - 1)), f"the reader thread takes {sig.name}"
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # the caller's mask is as it was
        assert not _blocked(threading.get_native_id()) & (1 << (signal.SIGINT - 1))


def test_a_runtime_dir_fallback_another_user_made_is_refused_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without XDG_RUNTIME_DIR, platformdirs falls back to /tmp/runtime-<uid> and refuses it when
    another user made it first: agentctl says so as unreachable (exit 5), agentd as unusable (78),
    not with platformdirs' PermissionError traceback."""
    import platformdirs
    from click.testing import CliRunner

    from agentctl.cli import cli
    from agentctl.client import Unreachable, default_socket_path
    from agentd import _trust
    from agentd.__main__ import _load

    def refuse(app: str) -> str:
        raise PermissionError("runtime directory /tmp/runtime-4242 is owned by uid 1002, not 4242; "
                              "set XDG_RUNTIME_DIR instead")

    for key in ("AGENTD_SOCKET", "AGENTD_RUNTIME_DIR", "XDG_RUNTIME_DIR", "AGENTD_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(platformdirs, "user_runtime_dir", refuse)
    with pytest.raises(_trust.Untrusted, match="owned by uid 1002"):
        _trust.user_runtime_dir("agentd")
    with pytest.raises(Unreachable, match=r"runtime dir .*owned by uid 1002.*AGENTD_RUNTIME_DIR"):
        default_socket_path()
    result = CliRunner().invoke(cli, ["status"], prog_name="agentctl")
    assert result.exit_code == 5 and "owned by uid 1002" in result.output
    with pytest.raises(SystemExit) as stopped:
        _load(None)
    assert stopped.value.code == _trust.EXIT_UNUSABLE
