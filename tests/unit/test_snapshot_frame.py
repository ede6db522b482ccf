"""A snapshot frame never passes what a client accepts, however much an in-flight item streamed."""

from __future__ import annotations

from agentd import wire
from agentd.server import _snapshot_frame


def test_a_huge_in_flight_item_keeps_its_latest_text_within_the_clients_frame_limit() -> None:
    # 65 MiB streamed so far: what agentd's provider ceiling lets an item reach, plus the JSON around it
    text = "".join(f"{n:03d}" + "y" * ((1 << 20) - 3) for n in range(65))
    small = wire.InFlightItem(id="small", kind="reasoning", text="thinking")
    snap = wire.Snapshot(state=wire.ConversationState.RUNNING, last_seq=7, run="r1",
                         items=[wire.InFlightItem(id="big", kind="assistant", text=text), small])
    frame = _snapshot_frame(3, "c1", snap)
    assert len(frame) <= wire.CLIENT_MAX_FRAME_BYTES
    got = wire.decode_server_frame(frame)
    assert isinstance(got, wire.SnapshotFrame) and got.sub == 3 and got.conversation == "c1"
    big, kept = got.snapshot.items
    assert kept == small, "an item under the cut is sent whole"
    head, _, tail = big.text.partition("\n")
    assert "characters before this cut from the snapshot" in head
    assert text.endswith(tail) and len(tail) < len(text), "the latest part is kept"


def test_a_snapshot_within_the_limit_is_sent_as_it_is() -> None:
    snap = wire.Snapshot(state=wire.ConversationState.RUNNING, last_seq=7, run="r1",
                         items=[wire.InFlightItem(id="i", kind="assistant", text="Hello")])
    got = wire.decode_server_frame(_snapshot_frame(1, "c1", snap))
    assert isinstance(got, wire.SnapshotFrame) and got.snapshot == snap
