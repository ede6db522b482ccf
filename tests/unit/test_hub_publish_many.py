"""Hub.publish_many delivers exactly what publish would, record by record, in one offer per subscriber."""

from __future__ import annotations

import pytest

from agentd.hub import Hub, LiveRun, Subscription


class Outbox:
    """Collects what a connection would send; holds at most ``limit`` frames."""

    def __init__(self, limit: int = 1000) -> None:
        self.data = b""
        self.frames = 0
        self.limit = limit
        self.lagged_subs: list[Subscription] = []

    def offer(self, frame: bytes) -> bool:
        return self.offer_many(frame, 1)

    def offer_many(self, frames: bytes, count: int) -> bool:
        if self.frames + count > self.limit:
            return False
        self.data += frames
        self.frames += count
        return True

    def lagged(self, subscription: Subscription) -> None:
        self.lagged_subs.append(subscription)


RECORDS = [(0, b'{"type":"delta","n":0}'), (5, b'{"type":"item","seq":5}'), (0, b'{"type":"delta","n":1}'), (6, b'{"type":"turn","seq":6}')]


def _hub(after: int = 4, limit: int = 1000) -> tuple[Hub, list[Outbox], list[Subscription]]:
    hub = Hub()
    boxes = [Outbox(limit), Outbox(limit), Outbox(limit)]
    subs = [Subscription(1, "c1", boxes[0], after=after), Subscription(2, "c1", boxes[1], after=after), Subscription(3, None, boxes[2])]
    for sub in subs:
        sub.live = True
        hub.add(sub)
    return hub, boxes, subs


def test_a_burst_reaches_every_subscriber_as_the_same_bytes_as_one_by_one() -> None:
    one, one_boxes, one_subs = _hub()
    for seq, line in RECORDS:
        one.publish("c1", seq, line)
    many, many_boxes, many_subs = _hub()
    many.publish_many("c1", RECORDS)
    assert [b.data for b in many_boxes] == [b.data for b in one_boxes]
    assert [b.frames for b in many_boxes] == [4, 4, 4]
    assert [s.cursor for s in many_subs[:2]] == [6, 6]
    assert many_subs[2].positions == {"c1": 6}
    assert many_boxes[0].data.count(b'{"type":"event","sub":1,"conversation":"c1","record":{"type":') == 4


def _run(*texts: str) -> LiveRun:
    return LiveRun(b'{"type":"delta","data":{"text":', [b'"%s"' % t.encode() for t in texts], b"}}")


WITH_RUNS = [(0, _run("a", "b")), (5, b'{"type":"item","seq":5}'), (0, b'{"type":"delta","n":1}'), (0, _run("c")),
             (0, _run("d", "e", "f")), (6, b'{"type":"turn","seq":6}')]


def _one_by_one(records: list) -> list[tuple[int, bytes]]:
    return [(seq, one) for seq, line in records for one in (line.lines() if isinstance(line, LiveRun) else [line])]


@pytest.mark.parametrize("records", [WITH_RUNS, WITH_RUNS[:1], WITH_RUNS[3:5], WITH_RUNS[1:4]])
@pytest.mark.parametrize("after", [4, 5])  # 5: the catch-up delivered seq 5 (the one-by-one path)
def test_a_run_of_live_records_reaches_every_subscriber_as_its_lines_one_by_one(records: list, after: int) -> None:
    one, one_boxes, one_subs = _hub(after)
    for seq, line in _one_by_one(records):
        one.publish("c1", seq, line)
    many, many_boxes, many_subs = _hub(after)
    many.publish_many("c1", records)
    assert [b.data for b in many_boxes] == [b.data for b in one_boxes]
    assert [b.frames for b in many_boxes] == [b.frames for b in one_boxes]
    assert [s.cursor for s in many_subs] == [s.cursor for s in one_subs]
    assert [s.positions for s in many_subs] == [s.positions for s in one_subs]


def test_a_run_counts_as_its_records_against_the_outbox() -> None:
    hub, boxes, subs = _hub(limit=6)  # WITH_RUNS is 9 records in 6 entries
    hub.publish_many("c1", WITH_RUNS)
    assert boxes[0].data == b"" and boxes[0].lagged_subs == [subs[0]]


def test_records_the_catch_up_already_delivered_are_skipped() -> None:
    hub, boxes, subs = _hub(after=5)  # seq 5 came with the catch-up
    hub.publish_many("c1", RECORDS)
    assert b'"seq":5' not in boxes[0].data
    assert boxes[0].frames == 3 and subs[0].cursor == 6


def test_a_subscriber_without_room_for_the_burst_is_cut_off_with_none_of_it() -> None:
    hub, boxes, subs = _hub(limit=3)
    hub.publish_many("c1", RECORDS)
    assert boxes[0].data == b"" and boxes[0].lagged_subs == [subs[0]]
    assert subs[0].closed and subs[0].cursor == 4  # resume after what it had


async def test_a_burst_larger_than_the_buffer_reaches_a_subscriber_that_keeps_up() -> None:
    # The real outbox: with subscriber_buffer below the pump's burst size (PUMP_BATCH), a reader
    # that has taken everything so far must not be cut off for one burst.
    import trio.testing

    from agentd.server import _Connection

    send, _receive = trio.testing.memory_stream_pair()
    conn = _Connection(None, send, "test", buffer=2)  # type: ignore[arg-type]
    assert conn.offer_many(b"a\nb\nc\n", 3)  # empty: taken, though 3 > 2
    assert not conn.offer_many(b"d\n", 1)  # still queued (nobody writes here): full
    assert not conn.offer(b"e\n")
