"""Bad input on the control protocol: every frame gets a result, an error frame, or a closed connection.

Property tests (hypothesis) of ``wire.decode_request`` and of every request
type, on the codec directly and (fewer examples) against the live daemon's
socket. ``AGENTD_FUZZ_SCALE`` multiplies the example counts (default 1).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import ECHO, fast_daemon, log_events, new, run_turn, turn_state
from .fuzz import FRAMES, REQUEST_TYPES, any_line, mutated_request, simple_fields, valid_request, valid_requests

SCALE = float(os.environ.get("AGENTD_FUZZ_SCALE", "1"))


def _n(base: int) -> int:
    return max(1, int(base * SCALE))


def _check_codec(line: bytes) -> None:
    started = time.monotonic()
    try:
        request = wire.decode_request(line)
    except wire.ProtocolError as exc:
        assert exc.code in ("invalid", "unsupported"), exc.code
        assert exc.message
        assert exc.request_id is None or isinstance(exc.request_id, int)
        frame = wire.decode_server_frame(wire.encode_error(exc.request_id, exc)[:-1])  # it can be sent
        assert isinstance(frame, wire.ErrorFrame)
    else:
        assert type(request) in REQUEST_TYPES
        assert wire.decode_request(wire.encode(request)[:-1]) == request  # and it round-trips
    assert time.monotonic() - started < 2.0, "decoding one frame took too long"


@settings(max_examples=_n(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=any_line)
def test_any_line_decodes_to_a_request_or_a_protocol_error(line: bytes) -> None:
    FRAMES["codec: any line"] += 1
    _check_codec(line)


@settings(max_examples=_n(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(line=mutated_request())
def test_mutated_requests_decode_or_fail_with_a_protocol_error(line: bytes) -> None:
    FRAMES["codec: mutated request"] += 1
    _check_codec(line)


@pytest.mark.parametrize("cls", REQUEST_TYPES, ids=lambda cls: cls.__struct_config__.tag)
def test_every_request_type_decodes_its_valid_frames_and_refuses_wrong_types(cls: type) -> None:
    fields = simple_fields(cls)

    @settings(max_examples=_n(200), deadline=None)
    @given(req=valid_request(cls), pick=st.integers(min_value=0), data=st.data())
    def check(req: dict, pick: int, data: st.DataObject) -> None:
        FRAMES["codec: request types"] += 1
        decoded = wire.decode_request(msgspec.json.encode(req))
        assert type(decoded) is cls and decoded.id == req["id"]
        if not fields:
            return
        FRAMES["codec: request types"] += 1
        name, tp = fields[pick % len(fields)]
        if isinstance(tp, (msgspec.inspect.StrType, msgspec.inspect.LiteralType)):
            wrong = data.draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=2), st.none()))
        else:
            wrong = data.draw(st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=2), st.none()))
        with pytest.raises(wire.ProtocolError) as err:
            wire.decode_request(msgspec.json.encode(dict(req, **{name: wrong})))
        assert err.value.code == "invalid"
        assert f"$.{name}" in err.value.message and err.value.request_id == req["id"]

    check()


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 200_000,
        b'{"id": 1, "op": "status", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"id": 1, "op": "answer", "conversation": "c", "interaction": "i", "answer": {"answers": '
        + b"[" * 50_000 + b"]" * 50_000 + b"}}",
        b'{"id": 1, "op": "send", "conversation": "c", "text": "\xed\xa0\x80"}',
        b'{"id": 1e999, "op": "status"}',
        b'{"id": 1, "op": "status"' + b" " * 500_000 + b"}",
        b"\x00" * 1000,
    ],
    ids=["deep-array", "deep-unknown-field", "deep-answer", "surrogate", "huge-float-id", "whitespace", "nul"],
)
def test_pathological_frames_are_protocol_errors(line: bytes) -> None:
    FRAMES["codec: pathological"] += 1
    _check_codec(line)


# --------------------------------------------------------------------------- the live daemon


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = fast_daemon(tmp_path_factory.mktemp("fuzz-live")).start()
    try:
        yield d
    finally:
        d.stop()


class _Prober:
    """One connection that sends a fuzzed line, then a status request, and reads up to its answer."""

    def __init__(self, d: Daemon) -> None:
        self.d = d
        self.client: Client | None = None
        self.closed = 0
        self.replies: collections_counter = {}

    def probe(self, line: bytes) -> None:
        if self.client is None:
            self.client = self.d.client()
        client = self.client
        rid = 10_000_000 + client.next_id
        client.next_id += 1
        try:
            client.send_raw(line + b"\n" + wire.encode(wire.Status(id=rid)))
            while True:
                frame = client.read()
                if isinstance(frame, (wire.ResultFrame, wire.ErrorFrame)):
                    kind = frame.error.code if isinstance(frame, wire.ErrorFrame) else "result"
                    assert kind != "internal" or "TypeError" not in frame.error.message, frame
                    if frame.id == rid:
                        return
                    self.replies[kind] = self.replies.get(kind, 0) + 1
                else:
                    assert isinstance(frame, (wire.EventFrame, wire.SnapshotFrame, wire.LaggedFrame)), frame
        except (EOFError, ConnectionError, socket.timeout):
            # A closed connection is a valid answer (a frame over the limit); the daemon must live on.
            self.closed += 1
            client.close()
            self.client = None
            assert self.d.proc is not None and self.d.proc.poll() is None, "agentd died"


collections_counter = dict


def test_fuzzed_frames_on_the_live_socket_never_crash_or_hang_the_daemon(live: Daemon, tmp_path: Path) -> None:
    prober = _Prober(live)

    @settings(max_examples=_n(1000), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
    @given(line=st.one_of(any_line, mutated_request(), valid_requests.map(msgspec.json.encode)))
    def check(line: bytes) -> None:
        FRAMES["live socket"] += 1
        prober.probe(line)

    check()
    if prober.client is not None:
        prober.client.close()
    # Alive, nothing failed inside, and it still runs a turn.
    bad = [e for e in log_events(live) if e.get("event") in ("server.request_failed", "server.connection_failed")]
    assert not bad, bad[:3]
    work = tmp_path / "work"
    work.mkdir()
    with live.client() as client:
        cid = new(client, work, ECHO)
        client.subscribe(cid)
        assert turn_state(run_turn(client, cid, "after the fuzz")[-1]) == "completed"
