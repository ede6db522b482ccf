"""The control protocol against the real daemon: greeting, bad frames, limits."""

from __future__ import annotations

import socket

import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon


def test_hello_with_another_protocol_version_is_refused_with_both_versions(daemon: Daemon) -> None:
    with Client(daemon.socket, hello=False) as client:
        client.send_raw(wire.encode(wire.Hello(id=0, protocol=999)))
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame)
        assert frame.error.code == "invalid"
        assert "protocol mismatch" in frame.error.message
        assert frame.error.details == {"server": wire.PROTOCOL_VERSION, "client": 999}
        with pytest.raises(EOFError):
            client.read()


def test_a_request_before_hello_is_refused(daemon: Daemon) -> None:
    with Client(daemon.socket, hello=False) as client:
        client.send_raw(wire.encode(wire.Status(id=4)))
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame) and frame.id == 4
        assert "hello" in frame.error.message


def test_unknown_op_answers_unsupported_and_the_connection_goes_on(daemon: Daemon) -> None:
    with daemon.client() as client:
        client.send_raw(b'{"id": 7, "op": "launch_missiles"}\n')
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame)
        assert (frame.id, frame.error.code) == (7, "unsupported")
        assert "launch_missiles" in frame.error.message
        assert client.request(wire.Status)["pid"] == daemon.proc.pid


@pytest.mark.parametrize(
    "line, code, fragment",
    [
        (b"{not json", "invalid", "malformed"),
        (b"[1, 2, 3]", "invalid", "malformed"),
        (b'{"id": 3}', "invalid", "no op"),
        (b'{"id": 3, "op": "send", "conversation": 5, "text": "x"}', "invalid", "$.conversation"),
        (b'{"id": 3, "op": "send", "conversation": "c", "text": "x", "bogus": 1}', "invalid", "bogus"),
        (b'\xff\xfe{"id": 1}', "invalid", "malformed"),
    ],
)
def test_malformed_frames_get_an_error_frame_and_nothing_else_is_disturbed(
    daemon: Daemon, line: bytes, code: str, fragment: str
) -> None:
    with daemon.client() as bystander, daemon.client() as client:
        client.send_raw(line + b"\n")
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame)
        assert frame.error.code == code
        assert fragment in frame.error.message
        # The same connection and another one keep working.
        assert client.request(wire.Status)["protocol"] == wire.PROTOCOL_VERSION
        assert bystander.request(wire.Status)["protocol"] == wire.PROTOCOL_VERSION


def test_an_oversized_frame_gets_a_limit_error_and_closes_only_that_connection(tmp_path) -> None:
    d = Daemon(tmp_path, "[server]\nmax_frame_bytes = 4096\n").start()
    try:
        with d.client() as bystander, d.client() as client:
            client.send_raw(b'{"id": 1, "op": "status", "pad": "' + b"x" * 10000 + b'"}\n')
            frame = client.read()
            assert isinstance(frame, wire.ErrorFrame)
            assert frame.error.code == "limit"
            with pytest.raises((EOFError, ConnectionResetError)):
                client.read()
            assert bystander.request(wire.Status)["conversations"] == 0
    finally:
        d.stop()


def test_socket_dir_is_0700_and_socket_0600(daemon: Daemon) -> None:
    assert daemon.socket.stat().st_mode & 0o777 == 0o600
    assert daemon.socket.parent.stat().st_mode & 0o777 == 0o700


def test_status_reports_the_daemon(daemon: Daemon) -> None:
    with daemon.client() as client:
        status = client.request(wire.Status)
    assert status["pid"] == daemon.proc.pid
    assert status["socket"] == str(daemon.socket)
    assert "script" in status["providers"]


def test_unknown_conversation_is_not_found(daemon: Daemon) -> None:
    with daemon.client() as client:
        with pytest.raises(c.NotFound):
            client.request(wire.Show, conversation="c-nope")


def test_a_client_that_vanishes_mid_frame_disturbs_no_one(daemon: Daemon) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(daemon.socket))
    raw.sendall(b'{"id": 0, "op": "hello", "protocol": 1}\n{"id": 1, "op": "sta')
    raw.close()
    with daemon.client() as client:
        assert client.request(wire.Status)["pid"] == daemon.proc.pid


def test_second_daemon_on_the_same_state_dir_exits_naming_the_holder(daemon: Daemon, tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "agentd", "run"], env=daemon.env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"pid {daemon.proc.pid}" in proc.stderr
    with daemon.client() as client:  # the first one is untouched
        assert client.request(wire.Status)["pid"] == daemon.proc.pid


def test_broken_config_exits_78_naming_the_key(tmp_path) -> None:
    import subprocess
    import sys

    d = Daemon(tmp_path, '[journal]\nfsync = "sometimes"\n')
    proc = subprocess.run([sys.executable, "-m", "agentd", "run"], env=d.env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 78
    assert "journal.fsync" in proc.stderr


def test_a_first_frame_over_64_kib_before_hello_is_refused_and_after_hello_a_large_one_is_read(daemon: Daemon) -> None:
    # Before hello a connection may send at most PRE_HELLO_MAX_FRAME_BYTES: else each of
    # max_connections could hold server.max_frame_bytes (16 MiB) of a first frame unread.
    from agentd.server import PRE_HELLO_MAX_FRAME_BYTES

    with Client(daemon.socket, hello=False) as client:
        client.send_raw(b'{"id": 0, "op": "hello", "pad": "' + b"x" * (PRE_HELLO_MAX_FRAME_BYTES + 10))
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame) and frame.error.code == "limit"
        assert "before hello" in frame.error.message
        with pytest.raises((EOFError, ConnectionResetError)):
            client.read()
    with daemon.client() as client:  # greeted: a frame of a megabyte is read (and found wanting)
        client.send_raw(b'{"id": 5, "op": "status", "pad": "' + b"x" * (1 << 20) + b'"}\n')
        frame = client.read()
        assert isinstance(frame, wire.ErrorFrame) and (frame.id, frame.error.code) == (5, "invalid")
        assert client.request(wire.Status)["pid"] == daemon.proc.pid
