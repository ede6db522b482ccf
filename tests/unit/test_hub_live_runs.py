"""A run of deltas (hub.LiveRun) reaches each subscriber as publishing its records one by one did,
against the real outbox (agentd.server._Connection).

The real outbox decides differently for one frame and for several: ``offer`` refuses only once
the queued bytes are at or over the byte limit, ``offer_many`` when the new frames would pass it,
and takes all or none. So where records used to go one by one (a burst of one delta, deltas
published with no hold, a subscriber whose catch-up overlaps the burst), a run must too: the
same bytes, frame counts, lag decisions and cursors.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from agentd import contract as c
from agentd import conversations as cv
from agentd import wire
from agentd.hub import Hub, LiveRun, Subscription
from agentd.server import _Connection

HEAD, TAIL = b'{"type":"delta","data":{"text":', b"}}"


def _conn(buffer: int = 100, buffer_bytes: int = 100, queued: int = 0) -> _Connection:
    """An outbox nobody writes from, with a response of ``queued`` bytes still in it (if any)."""
    conn = _Connection(None, object(), "t", buffer, buffer_bytes=buffer_bytes)  # type: ignore[arg-type]
    if queued:
        assert conn.offer(b"x" * queued)
    return conn


def _sub(hub: Hub, conn: _Connection, conversation: str | None = "c1", after: int = 0, sub_id: int = 1) -> Subscription:
    sub = Subscription(sub_id, conversation, conn, after=after)
    sub.live = True
    hub.add(sub)
    conn.subscriptions[sub.id] = sub
    return sub


def _state(conn: _Connection, sub: Subscription) -> tuple:
    return b"".join(conn._frames), conn._count, sub.id in conn.subscriptions, sub.cursor, dict(sub.positions)


def _service() -> tuple[cv.ConversationService, cv._Live]:
    class Journal:
        last_seq = 0

    service = object.__new__(cv.ConversationService)
    service.hub = Hub()
    record = wire.ConversationRecord(id="c1", provider="p", workdir="/", created_at="", updated_at="", active_run="r1")
    return service, cv._Live(record, Journal())  # type: ignore[arg-type]


@pytest.mark.parametrize("conversation", ["c1", None])
def test_a_run_of_one_delta_takes_the_rule_for_one_frame(conversation: str | None) -> None:
    # 90 queued bytes of 100: one frame more is taken (offer), though 90 + its size is over (offer_many).
    body = b'"hello"'
    one, many = _conn(queued=90), _conn(queued=90)
    hub1, hub2 = Hub(), Hub()
    s1, s2 = _sub(hub1, one, conversation), _sub(hub2, many, conversation)
    hub1.publish("c1", 0, HEAD + body + TAIL)
    hub2.publish_many("c1", [(0, LiveRun(HEAD, [body], TAIL))])
    assert _state(many, s2) == _state(one, s1)
    assert s2.id in many.subscriptions  # not cut off


def test_a_burst_of_one_delta_through_the_stream_path_is_not_cut_off() -> None:
    service, live = _service()
    conn = _conn(queued=90)
    sub = _sub(service.hub, conn)
    live.held = []
    service._stream(live, [c.Delta(item_id="i", kind=c.ItemKind.ASSISTANT, text="hello world")])
    service._flush(live)
    assert sub.id in conn.subscriptions and conn._count == 2
    assert b'"text":"hello world"' in conn._frames[-1]


def test_deltas_streamed_with_no_hold_go_one_by_one() -> None:
    # No hold (a handler published what was held mid-burst): each delta to the rule for one
    # frame, so a subscriber with room for 3 more frames gets 3 of 5, then is cut off.
    service, live = _service()
    conn = _conn(buffer=4, buffer_bytes=1 << 20, queued=1)
    sub = _sub(service.hub, conn)
    live.held = None
    words = ["one. ", "two. ", "three. ", "four. ", "five. "]  # none may start a secret: none held back
    service._stream(live, [c.Delta(item_id="i", kind=c.ItemKind.ASSISTANT, text=t) for t in words])
    frames = b"".join(conn._frames[1:]).splitlines()
    assert [msgspec.json.decode(wire.decode_record(wire.decode_server_frame(f).record).data)["text"]
            for f in frames] == words[:3]
    assert sub.id not in conn.subscriptions  # then cut off


def test_a_run_in_a_burst_the_catch_up_overlaps_goes_one_by_one() -> None:
    # The catch-up delivered seq 5: publish_many goes record by record for this subscriber.
    hub1, hub2 = Hub(), Hub()
    one, many = _conn(buffer=1000, buffer_bytes=200, queued=150), _conn(buffer=1000, buffer_bytes=200, queued=150)
    s1, s2 = _sub(hub1, one, after=5), _sub(hub2, many, after=5)
    bodies = [b'"abcdefghij"'] * 3
    hub1.publish_many("c1", [(5, b'{"seq":5}')] + [(0, HEAD + b + TAIL) for b in bodies] + [(6, b'{"seq":6}')])
    hub2.publish_many("c1", [(5, b'{"seq":5}'), (0, LiveRun(HEAD, bodies, TAIL)), (6, b'{"seq":6}')])
    assert _state(many, s2) == _state(one, s1)


def _burst(rng: random.Random) -> tuple[list, list]:
    """A burst with runs, and the same burst as plain lines."""
    runs, lines, seq = [], [], 10
    for _ in range(rng.randint(1, 7)):
        if rng.random() < 0.4:
            seq += 1
            runs.append((seq, b'{"seq":%d}' % seq))
            lines.append(runs[-1])
        else:
            bodies = [b'"%d"' % rng.randint(0, 99) for _ in range(rng.randint(1, 4))]
            runs.append((0, LiveRun(HEAD, bodies, TAIL)))
            lines.extend((0, HEAD + b + TAIL) for b in bodies)
    return runs, lines


def test_bursts_with_runs_reach_every_kind_of_subscriber_as_their_lines() -> None:
    # Subscribers of the conversation and of all, catching up or live, cut off mid-burst, shut, with
    # a catch-up overlapping the burst or not; the reference is the burst of plain lines (one by
    # one when it is one record, as the pump's hold publishes it).
    rng = random.Random(7)
    for case in range(600):
        runs, lines = _burst(rng)
        results = []
        for records in (runs, lines):
            r = random.Random(case)
            hub, out = Hub(), []
            for i in range(4):
                conn = _conn(buffer=r.randint(1, 12), buffer_bytes=r.randint(50, 600),
                             queued=r.randint(1, 120) if r.random() < 0.6 else 0)
                conn._shut = r.random() < 0.15
                sub = _sub(hub, conn, "c1" if i < 2 else None, after=r.choice([0, 9, 11]), sub_id=i + 1)
                sub.live = r.random() < 0.85
                out.append((conn, sub))
            hub.publish_many("c1", records)
            results.append([_state(conn, sub) for conn, sub in out])
        assert results[0] == results[1], (case, runs)
