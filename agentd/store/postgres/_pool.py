"""A small pool of psycopg connections, used from trio without blocking its loop.

Why threads: psycopg's own async connection runs on asyncio only; its sync connection is public,
complete and thread-safe per connection. So each call runs a plain function ``fn(conn, *args)`` on
one pooled connection in a worker thread (``trio.to_thread.run_sync``), bounded by a
``CapacityLimiter`` sized to the pool: at most ``size`` connections and threads, and callers past
that wait their turn in trio (a checkpoint), never in the loop. The LISTEN side, which must wait
indefinitely, does not hold a thread: see :mod:`._listen`.

Rules:

* Every call is a checkpoint. A cancelled caller waits for its statement to finish (the connection
  must not be abandoned mid-protocol); ``statement_timeout_s`` bounds that wait and every statement.
* ``fn`` runs inside one transaction (``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` when it raises) unless
  ``transaction=False`` (autocommit: each statement commits alone). The connection is in autocommit
  mode outside :meth:`Pool.run`, so no transaction is ever left open between calls.
* A connection that broke (server restart, network) is dropped and the call raises
  :class:`StoreUnavailable` (transient); the next call connects anew. Nothing is retried here:
  whether a failed write may be repeated is the caller's to decide. Errors the server returns
  (``psycopg.errors.UniqueViolation``, ``SerializationFailure`` ...) reach the caller as they are.
* Sessions run with ``TimeZone=UTC``; ``application_name`` (default ``agentd``), ``connect_timeout``
  and TCP keepalives are set unless the DSN sets them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import trio

from ._dsn import StoreUnavailable, describe, unavailable

__all__ = ["Pool", "connect"]

T = TypeVar("T")

#: libpq keepalives (unless the DSN sets them): a dead peer is noticed in about 10 + 3 * 5 = 25 s
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def connect(dsn: str, *, connect_timeout_s: float = 10.0, statement_timeout_s: float = 30.0,
            application_name: str = "agentd") -> psycopg.Connection[Any]:
    """A new autocommit connection to ``dsn`` (blocking: call it in a worker thread).

    Keywords the DSN sets win over these defaults. Raises :class:`StoreUnavailable` naming the
    target and libpq's cause (``permanent`` for a wrong password, role, database or DSN).
    """
    params = _conninfo_keys(dsn)
    extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in params}
    if "connect_timeout" not in params:
        extra["connect_timeout"] = max(1, math.ceil(connect_timeout_s))
    if "application_name" not in params:
        extra["application_name"] = application_name
    try:
        conn = psycopg.connect(dsn, autocommit=True, **extra)
    except (psycopg.Error, OSError) as exc:
        raise unavailable(dsn, exc) from None
    try:
        conn.execute("SELECT set_config('TimeZone', 'UTC', false), "
                     "set_config('statement_timeout', %s, false)", (f"{int(statement_timeout_s * 1000)}ms",))
    except psycopg.Error as exc:
        conn.close()
        raise unavailable(dsn, exc) from None
    return conn


def _conninfo_keys(dsn: str) -> set[str]:
    from psycopg import conninfo

    try:
        return set(conninfo.conninfo_to_dict(dsn))
    except psycopg.Error:
        return set()  # psycopg.connect reports it, through unavailable()


class Pool:
    """Up to ``size`` connections to ``dsn``, lent one call at a time; ``async with`` opens and closes it.

    :meth:`open` connects once at start so a wrong DSN fails there (:class:`StoreUnavailable`); later
    connections open on demand and idle ones are kept. :meth:`aclose` closes them; calls after it
    raise :class:`StoreUnavailable`. Use from one trio run.
    """

    def __init__(self, dsn: str, *, size: int = 4, connect_timeout_s: float = 10.0,
                 statement_timeout_s: float = 30.0, application_name: str = "agentd") -> None:
        if size < 1:
            raise ValueError("a pool needs at least one connection")
        self.dsn = dsn
        self.size = size
        self.target = describe(dsn)
        self._connect_kw = {"connect_timeout_s": connect_timeout_s, "statement_timeout_s": statement_timeout_s,
                            "application_name": application_name}
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        #: the server's version number (e.g. 150018), known after open()
        self.server_version = 0

    async def __aenter__(self) -> Pool:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _connect(self) -> psycopg.Connection[Any]:
        return connect(self.dsn, **self._connect_kw)  # type: ignore[arg-type]

    async def open(self) -> None:
        """Connect once (and keep that connection); raises :class:`StoreUnavailable` naming host and cause."""
        self.server_version = await self.run(lambda conn: conn.info.server_version, transaction=False)

    async def run(self, fn: Callable[..., T], *args: Any, transaction: bool = True) -> T:
        """``fn(conn, *args)`` on a pooled connection in a worker thread, in one transaction; its result.

        Waits (a checkpoint) for a free connection. Raises what ``fn`` raises (after a rollback),
        :class:`StoreUnavailable` when the pool is closed, cannot connect, or the connection broke.
        """
        if self._closed:
            raise StoreUnavailable(self.target, "the store is closed", permanent=False)
        async with self._limiter:
            conn = self._idle.pop() if self._idle else None
            try:
                # Not abandoned on cancel: once started, the statement finishes and the connection comes back.
                conn, error, result = await trio.to_thread.run_sync(self._job, conn, fn, args, transaction)
            except BaseException:  # cancelled before the thread started
                if conn is not None:
                    self._give_back(conn)
                raise
            if conn is not None:
                self._give_back(conn)
        if error is not None:
            if isinstance(error, psycopg.OperationalError) and (conn is None or conn.broken):
                raise unavailable(self.dsn, error) from error
            raise error
        return result  # type: ignore[return-value]

    def _job(self, conn: psycopg.Connection[Any] | None, fn: Callable[..., T], args: tuple[Any, ...],
             transaction: bool) -> tuple[psycopg.Connection[Any] | None, BaseException | None, T | None]:
        # Worker thread. Returns the connection (None if it could not be had) with the outcome, so the
        # trio side decides whether to keep it.
        if conn is not None and (conn.closed or conn.broken):
            conn.close()
            conn = None
        try:
            if conn is None:
                conn = self._connect()
            if transaction:
                with conn.transaction():
                    return conn, None, fn(conn, *args)
            return conn, None, fn(conn, *args)
        except Exception as exc:
            return conn, exc, None

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if self._closed or conn.closed or conn.broken or not idle:
            conn.close()  # a broken connection closes without I/O; an open one sends one Terminate message
        else:
            self._idle.append(conn)

    async def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in its own transaction; its rows ([] when it returns none)."""
        def job(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            cur = conn.execute(sql, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

        return await self.run(job)

    async def aclose(self) -> None:
        """Close every idle connection and refuse later calls; those lent out close when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        if idle:
            with trio.CancelScope(shield=True):  # closing is part of shutdown, which is often a cancellation
                await trio.to_thread.run_sync(lambda: [c.close() for c in idle])
