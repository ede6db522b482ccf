"""Conversation leases in PostgreSQL, shared by every agentd host on one database.

The rows (migration 0001): ``leases (key, owner, pid, acquired_at, expires_at, data)`` and
``hosts (owner, hostname, pid, site, providers, started_at, expires_at, data)``, one per agentd
instance. Rules:

* Expiry is the database's clock: a lease lasts until ``now() + ttl`` of the statement that wrote
  it, and is expired when ``expires_at <= now()``, so hosts whose clocks disagree still agree on
  who holds what. Times this module returns (``expires_at``, unix seconds) are the database's too;
  use ``Lease.expired`` (decided by the database when read), not ``time.time()``.
* Acquiring locks the row (``SELECT ... FOR UPDATE``, ``INSERT ... ON CONFLICT DO NOTHING``), so of
  two hosts racing for one key exactly one wins; the other gets :class:`~agentd.leases.LeaseHeld`.
* An expired lease of another owner is taken over: :class:`~agentd.leases.LeaseOutcome`
  ``taken_over`` with ``previous_owner`` and ``previous_expired``. Taking over is the only way to
  act on a dead host's conversation; :meth:`PgLeaseStore.expired` merely lists candidates.
* ``site`` names the state dir this instance runs on. The caller holds that state dir's
  :class:`~agentd.leases.DaemonLock`, so every other instance registered with the same site is
  dead: its leases are taken over at once (``previous_expired`` False), as the file store's
  ``exclusive`` does after a restart.
* Renewal is batched: each round of :meth:`PgLeaseStore.run` (every ``ttl_s / 3``) is one
  transaction of two statements, the host's heartbeat and ``UPDATE leases ... WHERE owner = $1 AND
  key = ANY($2)``, however many leases are held. A held key the update did not return was lost
  (taken over while our renewals lapsed, or deleted): it leaves :meth:`held` and is logged
  ``lease.lost``.

Every method that reads or writes the database is ``async`` and runs on the :class:`Pool`'s worker
threads; :meth:`held` is in memory. Errors: :class:`StoreUnavailable` when the database cannot be
reached (the lease state is then unknown: the caller treats the conversation as not leased).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import psycopg
import structlog
import trio
from psycopg.types.json import Jsonb

from ...contract import AgentdError, NotFound
from ...leases import Lease, LeaseHeld, LeaseOutcome
from ._dsn import StoreUnavailable
from ._pool import Pool

__all__ = ["Host", "PgLease", "PgLeaseStore"]

_LEASE_COLS = ("key, owner, pid, acquired_at, extract(epoch FROM expires_at)::float8, data, "
               "expires_at <= now()")


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.leases")


def _rfc3339(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class PgLease(Lease, frozen=True, kw_only=True):
    """A :class:`~agentd.leases.Lease` as the database has it: also its ``data`` and whether it ``expired``.

    ``expires_at`` is unix seconds by the database's clock; ``expired`` was decided by that clock when read.
    """

    data: dict[str, Any] = {}
    expired: bool = False


class Host(msgspec.Struct, frozen=True, kw_only=True):
    """An agentd instance using the database: its heartbeat row. ``alive`` is ``expires_at > now()`` when read."""

    owner: str
    hostname: str
    pid: int
    site: str
    providers: list[str]
    started_at: str
    expires_at: float
    alive: bool
    data: dict[str, Any] = {}


def _lease(row: tuple[Any, ...]) -> PgLease:
    key, owner, pid, acquired_at, expires_at, data, expired = row
    return PgLease(key, owner, pid, _rfc3339(acquired_at), expires_at, data=data or {}, expired=expired)


class PgLeaseStore:
    """Leases of ``owner`` (this daemon instance) in the database behind ``pool``; see the module docstring.

    ``ttl_s``: how long a lease lasts without renewal (``[leases] ttl_s``). ``site``: this state dir
    (``"<hostname>:<state dir>"``), or "" to take over only expired leases. ``providers``: the
    providers this host offers, published in its ``hosts`` row (task claims use them).
    """

    def __init__(self, pool: Pool, *, owner: str, ttl_s: float = 30.0, site: str = "",
                 providers: Sequence[str] = (), hostname: str | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.pool = pool
        self.owner = owner
        self.ttl_s = ttl_s
        self.site = site
        self.providers = list(providers)
        self.hostname = hostname or socket.gethostname()
        self._held: set[str] = set()
        self._pid = os.getpid()
        #: called (synchronously, from the renewal round) with each key found lost: the holder of a
        #: conversation must stop writing it (agentd.hosts.Peers)
        self.on_lost: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ host heartbeat

    def _beat(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO hosts (owner, hostname, pid, site, providers, expires_at) "
            "VALUES (%(owner)s, %(hostname)s, %(pid)s, %(site)s, %(providers)s, now() + %(ttl)s * interval '1 second') "
            "ON CONFLICT (owner) DO UPDATE SET expires_at = EXCLUDED.expires_at, providers = EXCLUDED.providers",
            {"owner": self.owner, "hostname": self.hostname, "pid": self._pid, "site": self.site,
             "providers": self.providers, "ttl": self.ttl_s})

    async def beat(self) -> None:
        """Write this instance's ``hosts`` row now (it lasts ``ttl_s``); :meth:`run` does it every round."""
        await self.pool.run(self._beat)

    async def hosts(self) -> list[Host]:
        """Every instance registered in the database, alive or not, by hostname then start."""
        rows = await self.pool.execute(
            "SELECT owner, hostname, pid, site, providers, started_at, extract(epoch FROM expires_at)::float8, "
            "expires_at > now(), data FROM hosts ORDER BY hostname, started_at")
        return [Host(owner=o, hostname=h, pid=p, site=s, providers=list(pr), started_at=_rfc3339(st), expires_at=e,
                     alive=a, data=d or {}) for o, h, p, s, pr, st, e, a, d in rows]

    async def clear_expired(self, key: str, owner: str) -> bool:
        """Delete ``owner``'s lease on ``key`` if it has expired (nobody needs to take it over); whether it did."""
        rows = await self.pool.execute("DELETE FROM leases WHERE key = %s AND owner = %s AND expires_at <= now() "
                                       "RETURNING key", (key, owner))
        return bool(rows)

    async def held_counts(self) -> dict[str, int]:
        """How many live (unexpired) leases each owner holds."""
        rows = await self.pool.execute("SELECT owner, count(*) FROM leases WHERE expires_at > now() GROUP BY owner")
        return {owner: int(n) for owner, n in rows}

    async def retire(self) -> None:
        """Remove this instance's ``hosts`` row (a clean stop); its leases are the caller's to release first."""
        with trio.CancelScope(shield=True):  # part of shutdown
            await self.pool.execute("DELETE FROM hosts WHERE owner = %s", (self.owner,))

    # ------------------------------------------------------------------ one lease

    def _acquire(self, conn: psycopg.Connection[Any], key: str, data: dict[str, Any]) -> LeaseOutcome:
        self._beat(conn)
        args = {"key": key, "owner": self.owner, "pid": self._pid, "ttl": self.ttl_s, "data": Jsonb(data)}
        for _ in range(3):  # a racer may insert between our SELECT and INSERT: then look again
            cur = conn.execute(
                f"SELECT {_LEASE_COLS}, (SELECT site FROM hosts WHERE hosts.owner = leases.owner) "
                "FROM leases WHERE key = %s FOR UPDATE", (key,)).fetchone()
            if cur is None:
                if conn.execute(
                        "INSERT INTO leases (key, owner, pid, expires_at, data) "
                        "VALUES (%(key)s, %(owner)s, %(pid)s, now() + %(ttl)s * interval '1 second', %(data)s) "
                        "ON CONFLICT (key) DO NOTHING RETURNING key", args).fetchone():
                    return LeaseOutcome("acquired")
                continue
            lease, site = _lease(cur[:-1]), cur[-1]
            if lease.owner == self.owner:
                outcome = LeaseOutcome("renewed")
            elif lease.expired or (self.site and site == self.site):
                outcome = LeaseOutcome("taken_over", previous_owner=lease.owner, previous_expired=lease.expired)
            else:
                raise LeaseHeld(lease)
            conn.execute(
                "UPDATE leases SET owner = %(owner)s, pid = %(pid)s, data = %(data)s, "
                "expires_at = now() + %(ttl)s * interval '1 second', "
                "acquired_at = CASE WHEN owner = %(owner)s THEN acquired_at ELSE now() END WHERE key = %(key)s", args)
            return outcome
        raise StoreUnavailable(self.pool.target, f"lease {key} kept changing under us", permanent=False)

    async def acquire(self, key: str, *, data: dict[str, Any] | None = None) -> LeaseOutcome:
        """Lease ``key`` to us for ``ttl_s`` (database clock), storing ``data`` (JSON) with it.

        No lease -> ``acquired``; ours -> ``renewed``; another owner's that expired, or of our own
        ``site`` -> ``taken_over``; another live owner's -> raises :class:`~agentd.leases.LeaseHeld`
        with that lease. Also raises :class:`StoreUnavailable`.
        """
        outcome = await self.pool.run(self._acquire, key, data or {})
        self._held.add(key)
        return outcome

    def _renew(self, conn: psycopg.Connection[Any], key: str) -> None:
        if conn.execute("UPDATE leases SET expires_at = now() + %s * interval '1 second' "
                        "WHERE key = %s AND owner = %s RETURNING key", (self.ttl_s, key, self.owner)).fetchone():
            return
        cur = conn.execute(f"SELECT {_LEASE_COLS} FROM leases WHERE key = %s", (key,)).fetchone()
        if cur is None:
            raise NotFound(f"no lease on {key}")
        raise LeaseHeld(_lease(cur))

    async def renew(self, key: str) -> None:
        """Extend our lease on ``key`` to ``ttl_s`` from now (database clock).

        Raises :class:`~agentd.leases.LeaseHeld` when another owner holds it now and
        :class:`~agentd.contract.NotFound` when it has no lease; either way ``key`` leaves :meth:`held`.
        :class:`StoreUnavailable` leaves it held (the next round retries).
        """
        try:
            await self.pool.run(self._renew, key)
        except (LeaseHeld, NotFound):
            self._held.discard(key)
            raise
        self._held.add(key)

    async def release(self, key: str) -> None:
        """Delete our lease on ``key``; idempotent; another owner's lease is left alone.

        Shielded from cancellation (it is part of closing, often of a shutdown): a lease left behind
        would keep every other host from the conversation for ``ttl_s``.
        """
        self._held.discard(key)
        with trio.CancelScope(shield=True):
            await self.pool.execute("DELETE FROM leases WHERE key = %s AND owner = %s", (key, self.owner))

    async def get(self, key: str) -> PgLease | None:
        """The lease on ``key`` whoever holds it, expired or not; None when there is none."""
        rows = await self.pool.execute(f"SELECT {_LEASE_COLS} FROM leases WHERE key = %s", (key,))
        return _lease(rows[0]) if rows else None

    def held(self) -> list[str]:
        """Keys we hold (acquired and not released or lost), sorted."""
        return sorted(self._held)

    async def expired(self, *, limit: int = 100) -> list[PgLease]:
        """Other owners' leases that expired (their host died or stalled), the longest expired first.

        Only candidates: another host may take one over first; act on one after :meth:`acquire`
        returned ``taken_over`` for it.
        """
        rows = await self.pool.execute(
            f"SELECT {_LEASE_COLS} FROM leases WHERE expires_at <= now() AND owner <> %s "
            "ORDER BY expires_at LIMIT %s", (self.owner, limit))
        return [_lease(r) for r in rows]

    # ------------------------------------------------------------------ renewal

    def _round(self, conn: psycopg.Connection[Any], keys: list[str]) -> set[str]:
        self._beat(conn)
        if not keys:
            return set()
        rows = conn.execute("UPDATE leases SET expires_at = now() + %s * interval '1 second' "
                            "WHERE owner = %s AND key = ANY(%s) RETURNING key", (self.ttl_s, self.owner, keys))
        return {r[0] for r in rows}

    async def renew_all(self) -> list[str]:
        """One renewal round now: the heartbeat and every held lease, in one transaction; the keys lost.

        Lost keys leave :meth:`held` and are logged (``lease.lost``). Raises :class:`StoreUnavailable`.
        """
        keys = sorted(self._held)
        renewed = await self.pool.run(self._round, keys)
        lost = [k for k in keys if k not in renewed and k in self._held]
        for key in lost:
            self._held.discard(key)
            _log().warning("lease.lost", key=key, reason="taken over or removed while our renewals lapsed")
            if self.on_lost is not None:
                self.on_lost(key)
        return lost

    async def sweep(self, *, older_than_s: float = 3600.0) -> int:
        """Delete ``hosts`` rows expired for ``older_than_s`` that hold no lease; how many."""
        rows = await self.pool.execute(
            "DELETE FROM hosts h WHERE h.owner <> %s AND h.expires_at < now() - %s * interval '1 second' "
            "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.owner = h.owner) RETURNING owner",
            (self.owner, older_than_s))
        return len(rows)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the heartbeat and every held lease every ``ttl_s / 3`` until cancelled (:meth:`renew_all`).

        Started once the first heartbeat is written (raises :class:`StoreUnavailable` if it cannot be);
        later failures are logged (``lease.renew_failed``) and retried next round. Never raises but
        Cancelled after that.
        """
        await self.beat()
        with contextlib.suppress(AgentdError):
            await self.sweep()
        task_status.started()
        while True:
            await trio.sleep(self.ttl_s / 3)
            try:
                await self.renew_all()
            except (AgentdError, psycopg.Error) as exc:
                _log().error("lease.renew_failed", key=self.owner, error=str(exc))
