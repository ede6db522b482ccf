"""A ConversationService in the test's own trio run, and a subscriber that records what it is handed.

For tests that need the service's interleavings under their control (a hold, a sync that
fails, two tasks on one conversation) rather than a daemon behind a socket:
:func:`in_process_service` starts the file store, the runtimes (the script provider) and
the service, with real checkpoints when asked; :func:`subscribe` adds a live subscriber
whose :class:`RecordingOutbox` keeps each hand-over apart (one hand-over is one socket
write in the server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from agentd import checkpoints as cp
from agentd import wire
from agentd.config import parse_config
from agentd.conversations import ConversationService
from agentd.hub import Hub, Subscription
from agentd.journal import FsyncPolicy
from agentd.leases import FileLeaseStore
from agentd.runtimes import Runtimes
from agentd.store.file import FileLeases, FileStore


class RecordingOutbox:
    """A subscriber's outbox, unbounded, that decodes and keeps each hand-over (``writes``)."""

    def __init__(self) -> None:
        self.writes: list[list[wire.Record]] = []

    @property
    def records(self) -> list[wire.Record]:
        """Every record handed over, in order."""
        return [r for batch in self.writes for r in batch]

    def offer(self, frame: bytes) -> bool:
        return self.offer_many(frame, 1)

    def offer_many(self, frames: bytes, count: int) -> bool:
        batch = []
        for line in frames.splitlines():
            event = wire.decode_server_frame(line)
            assert isinstance(event, wire.EventFrame)
            batch.append(wire.decode_record(event.record))
        assert len(batch) == count
        self.writes.append(batch)
        return True

    def lagged(self, sub: Subscription) -> None:  # pragma: no cover - the outbox is unbounded
        raise AssertionError("lagged")


def subscribe(hub: Hub, cid: str, after: int = 0, outbox: RecordingOutbox | None = None) -> RecordingOutbox:
    """A live subscriber of ``cid`` (records after seq ``after``), as the server's once caught up;
    its outbox (``outbox``, else a new one)."""
    outbox = RecordingOutbox() if outbox is None else outbox
    sub = Subscription(1, cid, outbox, after=after)
    sub.live = True
    hub.add(sub)
    return outbox


@asynccontextmanager
async def in_process_service(tmp_path: Path, extra: str = "", *, fsync: FsyncPolicy = FsyncPolicy.BATCH,
                             checkpoints: bool = False) -> AsyncIterator[tuple[ConversationService, Hub]]:
    """The service with its store under ``tmp_path/state`` (config text ``extra``), running until
    the block ends; with ``checkpoints``, real checkpoints (git) of the working directories."""
    config = parse_config(extra)
    state = tmp_path / "state"
    root = state / "conversations"
    store = FileStore(root, fsync=fsync, batch_ms=1)
    leases = FileLeases(FileLeaseStore(root, owner="test", ttl_s=30))
    hub = Hub()
    runtimes = Runtimes(config, state)
    service = ConversationService(store=store, leases=leases, runtimes=runtimes, hub=hub, fsync=fsync, owner="test")
    if checkpoints:
        service.checkpoints = cp.Checkpoints(config.checkpoints, state / "checkpoints", state)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await nursery.start(runtimes.run)
        if checkpoints:
            await nursery.start(service.checkpoints.run)
        await nursery.start(service.run)
        try:
            yield service, hub
        finally:
            nursery.cancel_scope.cancel()
    await store.aclose()
