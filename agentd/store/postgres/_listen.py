"""LISTEN/NOTIFY for trio: one connection that listens, and watches that wake the tasks waiting on it.

A writer calls :func:`notify` inside its transaction; PostgreSQL delivers the notification to every
listening session when (and only if) that transaction commits, in commit order. :class:`Listener`
holds one autocommit connection that has issued ``LISTEN`` on a fixed set of channels (say
``agentd_journal``, payload ``<conversation>:<seq>``), and waits for its socket in trio
(``trio.lowlevel.wait_readable``), so it holds no worker thread while idle. Each notification goes to
every :class:`Watch` on its channel.

What a watcher may rely on, and what it may not:

* A notification is a hint to read the database, never the data itself: payloads are short
  (PostgreSQL's limit is 8000 bytes) and notifications sent while nobody listened are lost.
* :meth:`Watch.next` returns ``None`` ("lagged") whenever notifications may have been missed: on the
  first connection and after every reconnection (a server restart, a broken network), and when the
  watch's bounded buffer (``buffer``) overflowed because its task fell behind. On ``None`` the watcher
  re-reads what it follows from the database; so reading after a seq, then waiting, loses nothing.
* ``async for note in watch`` is the watcher's loop: the same notifications and Nones, ending when
  the listener stops.
* The listener never blocks on a slow watcher (the buffer is dropped and the watch marked lagged).
* A lost connection is retried with backoff (0.1 s doubling to ``max_backoff_s``), logged as
  ``store.listen_lost`` / ``store.listen_restored``; TCP keepalives (see :mod:`._pool`) notice a
  silent peer in about 25 s.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import psycopg
import structlog
import trio
from psycopg import sql

from ._dsn import StoreUnavailable, describe
from ._pool import connect

__all__ = ["Listener", "Notification", "Watch", "notify"]

#: PostgreSQL's limit on a NOTIFY payload, bytes
MAX_PAYLOAD = 7999


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.store")


class Notification(msgspec.Struct, frozen=True):
    """A NOTIFY received: ``channel``, ``payload`` (text, may be ""), ``pid`` of the notifying backend."""

    channel: str
    payload: str
    pid: int = 0


def notify(conn: psycopg.Connection[Any], channel: str, payload: str = "") -> None:
    """Send ``payload`` on ``channel`` from ``conn``: delivered when its transaction commits (blocking).

    Raises ValueError for a payload over :data:`MAX_PAYLOAD` bytes (PostgreSQL would refuse it).
    """
    if len(payload.encode()) > MAX_PAYLOAD:
        raise ValueError(f"NOTIFY payload of {len(payload.encode())} bytes, over PostgreSQL's {MAX_PAYLOAD}")
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


class Watch:
    """The notifications on ``channels`` for one task, up to ``buffer`` queued; see the module docstring.

    Iterating it (``async for``) yields what :meth:`next` returns (a Notification, or None: re-read)
    and ends where :meth:`next` raises ``trio.EndOfChannel``.
    """

    def __init__(self, channels: frozenset[str], buffer: int) -> None:
        self.channels = channels
        self._buffer = buffer
        self._queue: collections.deque[Notification] = collections.deque()
        self._lagged = False
        self._closed = False
        self._wake = trio.Event()

    def _offer(self, n: Notification) -> None:
        if self._lagged:
            return  # the watcher re-reads everything anyway
        if len(self._queue) >= self._buffer:
            self._lag()
            return
        self._queue.append(n)
        self._wake.set()

    def _lag(self) -> None:
        self._queue.clear()
        self._lagged = True
        self._wake.set()

    def _close(self) -> None:
        self._closed = True
        self._wake.set()

    async def next(self) -> Notification | None:
        """The next notification, or None when some may have been missed (re-read the database).

        Waits (a checkpoint) until there is one. Raises ``trio.EndOfChannel`` once the listener stopped.
        """
        while True:
            if self._lagged:
                self._lagged = False
                await trio.lowlevel.checkpoint()
                return None
            if self._queue:
                await trio.lowlevel.checkpoint()
                return self._queue.popleft()
            if self._closed:
                # A checkpoint first, as every receive is one: a cancel already asked for (the
                # caller shutting down with the store) wins over the end of the channel.
                await trio.lowlevel.checkpoint()
                raise trio.EndOfChannel("the store's listener stopped")
            self._wake = trio.Event()
            await self._wake.wait()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Notification | None:
        try:
            return await self.next()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


class Listener:
    """One LISTEN connection to ``dsn`` on ``channels``; :meth:`run` keeps it, :meth:`watch` follows it.

    ``channels`` are fixed for the listener's life (identifiers, e.g. ``agentd_journal``): payloads say
    which conversation, so no LISTEN is issued while running.
    """

    def __init__(self, dsn: str, channels: Iterable[str], *, buffer: int = 1024, max_backoff_s: float = 5.0,
                 connect_timeout_s: float = 10.0) -> None:
        self.dsn = dsn
        self.channels = frozenset(channels)
        if not self.channels:
            raise ValueError("a listener needs at least one channel")
        self.target = describe(dsn)
        self._buffer = buffer
        self._max_backoff_s = max_backoff_s
        self._connect_timeout_s = connect_timeout_s
        self._watches: set[Watch] = set()
        #: True while the LISTEN connection is up
        self.connected = False

    @contextlib.contextmanager
    def watch(self, *channels: str, buffer: int | None = None) -> Iterator[Watch]:
        """A :class:`Watch` on ``channels`` (all of the listener's when none), for the ``with`` block.

        ``buffer``: how many notifications it queues before it is lagged (default: the listener's).
        Its first :meth:`Watch.next` is None only if a reconnection happens after this call, so a
        watcher reads the database after entering the block, then waits. Raises ValueError for a
        channel the listener does not listen on.
        """
        wanted = frozenset(channels) or self.channels
        if not wanted <= self.channels:
            raise ValueError(f"not listening on {sorted(wanted - self.channels)}")
        w = Watch(wanted, buffer or self._buffer)
        self._watches.add(w)
        try:
            yield w
        finally:
            self._watches.discard(w)

    def _open(self) -> psycopg.Connection[Any]:
        # Worker thread: connect and LISTEN on every channel.
        conn = connect(self.dsn, connect_timeout_s=self._connect_timeout_s, statement_timeout_s=30.0,
                       application_name="agentd-listen")
        try:
            for ch in sorted(self.channels):
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
        except psycopg.Error:
            conn.close()
            raise
        return conn

    def _dispatch(self, conn: psycopg.Connection[Any]) -> None:
        pgconn = conn.pgconn
        pgconn.consume_input()  # raises psycopg.OperationalError when the connection is gone
        while (n := pgconn.notifies()) is not None:
            note = Notification(n.relname.decode(), n.extra.decode(errors="replace"), n.be_pid)
            for w in list(self._watches):
                if note.channel in w.channels:
                    w._offer(note)

    async def _serve(self, conn: psycopg.Connection[Any]) -> None:
        """Read notifications until the connection fails (raises psycopg.OperationalError)."""
        while True:
            await trio.lowlevel.wait_readable(conn.pgconn.socket)
            self._dispatch(conn)
            if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the LISTEN connection closed")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting with backoff; started once the first LISTEN is in place.

        Raises :class:`StoreUnavailable` when the first connection fails (a start-up error); later
        failures are logged and retried. On the way out every watch ends (``trio.EndOfChannel``).
        """
        conn = await trio.to_thread.run_sync(self._open)
        started = False
        backoff = 0.1
        try:
            while True:
                self.connected = True
                for w in list(self._watches):
                    w._lag()  # anything sent before our LISTEN was in place is the database's to tell
                if not started:
                    task_status.started()
                    started = True
                try:
                    await self._serve(conn)
                except psycopg.Error as exc:
                    self.connected = False
                    _log().warning("store.listen_lost", target=self.target, error=str(exc).strip())
                finally:
                    conn.close()
                while True:
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, self._max_backoff_s)
                    try:
                        conn = await trio.to_thread.run_sync(self._open)
                        break
                    except (StoreUnavailable, psycopg.Error) as exc:
                        _log().warning("store.listen_retry", target=self.target, error=str(exc))
                backoff = 0.1
                _log().info("store.listen_restored", target=self.target)
        finally:
            self.connected = False
            for w in list(self._watches):
                w._close()
