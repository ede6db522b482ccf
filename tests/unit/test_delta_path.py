"""The pump's per-delta fast path produces exactly the records the general path did."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd import contract as c
from agentd import conversations as cv
from agentd import masking, wire
from agentd.hub import LiveRun
from agentd.itemids import ItemIds


def held_lines(held: list) -> list[bytes]:
    """Each record a conversation holds back, encoded (a LiveRun holds several)."""
    return [one for _, line in held for one in (line.lines() if isinstance(line, LiveRun) else [line])]


@pytest.mark.parametrize("type_", ["delta", "activity", 'odd "type"\\'])
@pytest.mark.parametrize("run", ["", "r0123456789ab", 'r"\u2028é'])
@pytest.mark.parametrize("data", [b"{}", b'{"item_id":"r.i","kind":"assistant","text":"a\\"b\\u0000"}'])
def test_a_live_line_is_the_encoded_record(type_: str, run: str, data: bytes) -> None:
    for _ in range(3):  # cold and warm caches
        line = cv._live_line(type_, data, run)
        record = msgspec.json.decode(line, type=wire.Record)
        assert line == cv._json.encode(wire.Record(type=type_, ts=record.ts, data=msgspec.Raw(data), run=run))
        assert record.ts == cv._now() or record.ts < cv._now()


def test_a_live_line_follows_the_run_and_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_700_000_000_123_000_000]
    monkeypatch.setattr(cv.time, "time_ns", lambda: now[0])
    a = cv._live_line("delta", b"{}", "r1")
    now[0] += 1_000_000
    b = cv._live_line("delta", b"{}", "r2")
    assert msgspec.json.decode(a)["ts"] == "2023-11-14T22:13:20.123Z" and msgspec.json.decode(a)["run"] == "r1"
    assert msgspec.json.decode(b)["ts"] == "2023-11-14T22:13:20.124Z" and msgspec.json.decode(b)["run"] == "r2"


def test_scope_delta_is_scope_of_its_event() -> None:
    a, b = ItemIds(), ItemIds()
    for run in ("", "r1", "r1", "r2"):
        for d in (c.Delta(item_id="i1", kind=c.ItemKind.ASSISTANT, text="x"),
                  c.Delta(item_id="i1", kind=c.ItemKind.REASONING, text="y", agent_id="sub")):
            assert a.scope_delta(d, run) == b.scope(c.DeltaEvent(delta=d), run).delta


@pytest.mark.parametrize(("size", "run"), [(5, 1), (5, 7), (3, 64), (1, 2)])
def test_a_secret_split_across_deltas_through_the_stream_path(monkeypatch: pytest.MonkeyPatch, size: int, run: int) -> None:
    monkeypatch.setattr(masking, "_registry", masking._Registry())
    secret = "sk-canary-3f9a1c7e5b2d4f608e1a9c3b7d5f2e4a"
    masking.register(secret)

    class Journal:
        last_seq = 0

    record = wire.ConversationRecord(id="c1", provider="p", workdir="/", created_at="", updated_at="", active_run="r1")
    live = cv._Live(record, Journal())  # type: ignore[arg-type]
    live.held = []
    service = object.__new__(cv.ConversationService)
    text = f"a key {secret} and Authorization: Bearer abcdefgh12345678 then \ud800 end"
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    for at in range(0, len(chunks), run):
        service._stream(live, [c.Delta(item_id="i", kind=c.ItemKind.ASSISTANT, text=t) for t in chunks[at:at + run]])
    service._release_deltas(live, None)
    sent = [msgspec.json.decode(line) for line in held_lines(live.held)]
    assert all(r["type"] == "delta" and r["run"] == "r1" and r["data"]["item_id"] == "r1.i" for r in sent)
    out = "".join(r["data"]["text"] for r in sent)
    assert secret[:8] not in out and "abcdefgh" not in out
    assert out == masking.mask_text(text).replace("\ud800", "\ufffd")
    assert "".join(live.items["r1.i"][2]) == masking.mask_text(text)


async def test_the_event_queue_keeps_order_wakes_its_reader_and_ends_after_a_close() -> None:
    import trio
    import trio.testing

    events = cv._Events()
    got: list[object] = []

    async def reader() -> None:
        while True:
            try:
                got.append(await events.get())
            except trio.EndOfChannel:
                got.append("end")
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        events.put(1)  # the reader is waiting: woken
        events.put(2)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [1, 2]
        events.put(3)
        events.close()  # what was put before the close is still read, then the end
        with pytest.raises(trio.ClosedResourceError):
            events.put(4)
    assert got == [1, 2, 3, "end"]
    with pytest.raises(trio.EndOfChannel):
        events.get_nowait()
    fresh = cv._Events()
    with pytest.raises(trio.WouldBlock):
        fresh.get_nowait()
    fresh.put(5)
    with trio.testing.assert_checkpoints():  # a ready event is still a checkpoint, as a channel's receive
        assert await fresh.get() == 5


async def test_an_idle_reader_woken_by_an_event_takes_one_scheduler_pass_to_get_it() -> None:
    # The wait is the checkpoint: a checkpoint before it too would cost an idle pump a second
    # pass of the run loop per wake-up, that is per chunk a runtime writes.
    import trio
    import trio.testing

    events = cv._Events()
    steps: list[int] = []
    got: list[object] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("reader"):
                steps.append(len(got))

    async def reader() -> None:
        got.append(await events.get())
        got.append(await events.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(instrument := Steps())
        try:
            events.put(1)
            await trio.testing.wait_all_tasks_blocked()
            assert got == [1] and steps == [0]  # woken once, and it has the event
            events.put(2)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(instrument)
    assert got == [1, 2] and steps == [0, 1]


def test_runs_of_interleaved_items_come_out_in_order_and_an_item_is_kept_from_its_first_text() -> None:
    class Journal:
        last_seq = 0

    record = wire.ConversationRecord(id="c1", provider="p", workdir="/", created_at="", updated_at="", active_run="r1")
    live = cv._Live(record, Journal())  # type: ignore[arg-type]
    live.held = []
    service = object.__new__(cv.ConversationService)
    a, r = c.ItemKind.ASSISTANT, c.ItemKind.REASONING
    service._stream(live, [c.Delta(item_id="t", kind=r, text="think "), c.Delta(item_id="t", kind=r, text="more "),
                           c.Delta(item_id="m", kind=a, text="say "), c.Delta(item_id="t", kind=r, text="again "),
                           c.Delta(item_id="x", kind=a, text="a")])  # "a" may start a secret: held back
    sent = [(r["data"]["item_id"], r["data"]["text"]) for r in (msgspec.json.decode(line) for line in held_lines(live.held))]
    assert sent == [("r1.t", "think "), ("r1.t", "more "), ("r1.m", "say "), ("r1.t", "again ")]
    assert set(live.items) == {"r1.t", "r1.m"}  # nothing of x was sent yet
    assert live.items["r1.t"] == ("reasoning", "", ["think ", "more ", "again "])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["i", "j", 'k"\\', "l\ud800"]), st.sampled_from(list(c.ItemKind)), st.sampled_from(["", "sub"]),
                          st.text(alphabet='ab "\\\n\u2028é\ud800x-Bearer', max_size=10)), max_size=20),
       st.integers(1, 8))
def test_the_stream_path_sends_the_bytes_the_general_path_did(deltas: list, run: int) -> None:
    class Journal:
        last_seq = 0

    def live() -> cv._Live:
        record = wire.ConversationRecord(id="c1", provider="p", workdir="/", created_at="", updated_at="", active_run="r1")
        one = cv._Live(record, Journal())  # type: ignore[arg-type]
        one.held = []
        return one

    service = object.__new__(cv.ConversationService)
    ds = [c.Delta(item_id=i, kind=k, agent_id=a, text=t) for i, k, a, t in deltas]
    fast, slow = live(), live()
    for at in range(0, len(ds), run):
        service._stream(fast, ds[at:at + run])
    for d in ds:  # what _handle did per DeltaEvent before the stream path
        d = slow.item_ids.scope(c.DeltaEvent(delta=d), "r1").delta
        data = cv._json.encode(d)
        text = slow.deltas.feed(d.item_id, d.text, d)
        if text is not d.text:
            if not text:
                continue
            d = msgspec.structs.replace(d, text=text)
            data = cv._json.encode(d)
        slow.items.setdefault(d.item_id, (d.kind.value, d.agent_id, []))[2].append(d.text)
        slow.held.append((0, cv._live_line("delta", data, "r1")))
    strip = lambda held: [msgspec.json.decode(line)["data"] for line in held_lines(held)]  # noqa: E731 (ts may differ by a ms)
    assert strip(fast.held) == strip(slow.held)
    assert [line.split(b',"data":', 1)[1] for line in held_lines(fast.held)] == [line.split(b',"data":', 1)[1] for line in held_lines(slow.held)]
    assert fast.items == slow.items
    assert fast.deltas._held == slow.deltas._held


def test_queued_deltas_go_as_runs_in_order_with_the_other_events() -> None:
    import trio

    events = cv._Events()
    d = [c.Delta(item_id="i", kind=c.ItemKind.ASSISTANT, text=str(k)) for k in range(cv.PUMP_RUN + 3)]
    events.put_delta(d[0])
    events.put_delta(d[1])
    events.put("turn")
    for x in d[2:]:
        events.put_delta(x)
    got = []
    while True:
        try:
            got.append(events.get_nowait())
        except trio.WouldBlock:
            break
    assert [type(g) for g in got] == [cv._Deltas, str, cv._Deltas, cv._Deltas]
    assert got[0] == d[:2] and got[1] == "turn" and len(got[2]) == cv.PUMP_RUN and got[2] + got[3] == d[2:]
    events.close()
    with pytest.raises(trio.ClosedResourceError):
        events.put_delta(d[0])
