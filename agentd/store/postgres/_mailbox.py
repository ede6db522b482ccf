"""Commands carried through the database to the host that holds a conversation's lease.

Any host serves every conversation, but only the lease holder drives its runtime. A host asked to
``send``, ``answer``, ``cancel`` or ``steer`` on a conversation another host holds posts the request
as a row of ``commands`` (migration 0001) addressed to that host, which takes it, runs it, and writes
the response; LISTEN/NOTIFY wakes both sides. The request and response are opaque bytes here (the
wire frames, say): this module knows nothing of what they mean.

Rules:

* :meth:`Mailbox.call` looks up the live lease holder and posts the command in one transaction; no
  live holder raises :class:`NoHolder` at once ("no host holds conversation X"), never a wait. Called
  with a ``site`` it looks up that site's live host instead (``hosts``, the newest registered), in
  the same transaction: :class:`SiteDown` at once when there is none.
* A command is taken by its target at most once (``queued`` -> ``taken``, a row update), and then
  answered (``answered``, with the response) or ``failed`` (the handler raised: the sender gets
  :class:`~agentd.contract.InternalError` with its text).
* When the caller's ``timeout_s`` passes, the command is ended in one update: if nobody took it yet
  it is ``expired`` and can never run (:class:`HolderSilent`: safe to try again); if its target took
  it but did not answer, it may or may not have run: :class:`~agentd.contract.SubmissionUncertain`,
  never retried (the contract's rule for prompts).
* The holder skips commands whose deadline (database clock) passed before it looked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import psycopg
import structlog
import trio

from ... import contract as c
from ._listen import Listener, notify
from ._pool import Pool

__all__ = ["COMMANDS_CHANNEL", "REPLIES_CHANNEL", "Command", "HolderSilent", "Mailbox", "NoHolder", "SiteDown"]

#: NOTIFY channel for new commands; payload: the target owner
COMMANDS_CHANNEL = "agentd_commands"
#: NOTIFY channel for answers; payload: "<sender owner> <command id>"
REPLIES_CHANNEL = "agentd_replies"


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.store")


class Command(msgspec.Struct, frozen=True):
    """A command taken by its target: ``id``, ``conversation_id``, ``op``, ``request`` (bytes), ``sender``."""

    id: int
    conversation_id: str
    op: str
    request: bytes
    sender: str


class NoHolder(c.Closed):
    """No live host holds the conversation's lease, so nobody can run a command on it."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"no host holds conversation {conversation_id}: it is not open on any agentd "
                         "(open it on a host that can run it)", details={"conversation": conversation_id})


class SiteDown(c.Closed):
    """No live agentd instance is registered with the site a command was addressed to."""

    def __init__(self, conversation_id: str, site: str) -> None:
        super().__init__(f"no agentd of site {site} is running to take the command on {conversation_id}",
                         details={"conversation": conversation_id, "site": site})


class HolderSilent(c.Closed):
    """The lease holder did not take the command in time; it never ran (safe to try again)."""

    def __init__(self, conversation_id: str, owner: str, timeout_s: float) -> None:
        super().__init__(f"agentd {owner}, which holds conversation {conversation_id}, did not take the command "
                         f"within {timeout_s:g} s; it did not run (the host may be dead: its lease will expire)",
                         details={"conversation": conversation_id, "owner": owner})


class Mailbox:
    """This host's (``owner``'s) side of the commands table: :meth:`call` others, :meth:`serve` its own.

    ``listener`` must listen on :data:`COMMANDS_CHANNEL` and :data:`REPLIES_CHANNEL`.
    """

    def __init__(self, pool: Pool, listener: Listener, *, owner: str) -> None:
        missing = {COMMANDS_CHANNEL, REPLIES_CHANNEL} - listener.channels
        if missing:
            raise ValueError(f"the listener must listen on {sorted(missing)}")
        self.pool = pool
        self.listener = listener
        self.owner = owner

    # ------------------------------------------------------------------ the sender

    def _post(self, conn: psycopg.Connection[Any], conversation_id: str, op: str, request: bytes,
              timeout_s: float, target: str | None, site: str | None) -> tuple[int, str]:
        if site is not None:  # the liveness rule of PgLeaseStore.hosts (expires_at > now()), its newest
            row = conn.execute("SELECT owner FROM hosts WHERE site = %s AND expires_at > now() "
                               "ORDER BY started_at DESC LIMIT 1", (site,)).fetchone()
            if row is None:
                raise SiteDown(conversation_id, site)
            target = row[0]
        elif target is None:
            row = conn.execute("SELECT owner FROM leases WHERE key = %s AND expires_at > now()",
                               (conversation_id,)).fetchone()
            if row is None:
                raise NoHolder(conversation_id)
            target = row[0]
        cid = conn.execute(
            "INSERT INTO commands (conversation_id, target, sender, op, request, deadline) "
            "VALUES (%s, %s, %s, %s, %s, now() + %s * interval '1 second') RETURNING id",
            (conversation_id, target, self.owner, op, request, timeout_s)).fetchone()[0]  # type: ignore[index]
        notify(conn, COMMANDS_CHANNEL, target)
        return cid, target

    def _poll(self, conn: psycopg.Connection[Any], command_id: int) -> tuple[str, bytes | None, str]:
        row = conn.execute("SELECT state, response, error FROM commands WHERE id = %s", (command_id,)).fetchone()
        return (row[0], row[1], row[2]) if row else ("missing", None, "")

    def _expire(self, conn: psycopg.Connection[Any], command_id: int) -> tuple[str, bytes | None, str]:
        if conn.execute("UPDATE commands SET state = 'expired', done_at = now() WHERE id = %s AND state = 'queued' "
                        "RETURNING id", (command_id,)).fetchone():
            return ("expired", None, "")
        return self._poll(conn, command_id)

    @staticmethod
    def _outcome(state: str, response: bytes | None, error: str, conversation_id: str, target: str) -> bytes | None:
        if state == "answered":
            return bytes(response or b"")
        if state == "failed":
            raise c.InternalError(f"agentd {target} failed to run the command on {conversation_id}: {error}")
        return None

    async def call(self, conversation_id: str, op: str, request: bytes, *, timeout_s: float = 30.0,
                   target: str | None = None, site: str | None = None) -> bytes:
        """Have the holder of ``conversation_id``'s lease (or the instance ``target``, or the live
        instance of ``site``) run ``op`` with ``request``; its response.

        Waits (a checkpoint) up to ``timeout_s``. Raises :class:`NoHolder` when no live host holds
        the lease, :class:`SiteDown` when no live instance has ``site``, :class:`HolderSilent` when the holder did not take it in time (it did not run),
        :class:`~agentd.contract.SubmissionUncertain` when it took it and did not answer in time,
        :class:`~agentd.contract.InternalError` when its handler failed, and StoreUnavailable.
        On cancellation the command is expired if not yet taken (shielded).
        """
        with self.listener.watch(REPLIES_CHANNEL) as replies:  # before posting: no answer can slip by
            command_id, target = await self.pool.run(self._post, conversation_id, op, request, timeout_s, target,
                                                     site)
            mine = f"{self.owner} {command_id}"
            done = False
            try:
                with trio.move_on_after(timeout_s):
                    while True:
                        got = self._outcome(*await self.pool.run(self._poll, command_id), conversation_id, target)
                        if got is not None:
                            done = True
                            return got
                        while (n := await replies.next()) is not None and n.payload != mine:
                            pass  # another sender's answer
            finally:
                if not done:
                    with trio.CancelScope(shield=True):
                        state, response, error = await self.pool.run(self._expire, command_id)
            got = self._outcome(state, response, error, conversation_id, target)
            if got is not None:
                return got
            if state == "expired":
                raise HolderSilent(conversation_id, target, timeout_s)
            raise c.SubmissionUncertain(
                f"agentd {target} took the command on {conversation_id} but did not answer within {timeout_s:g} s: "
                "it may or may not have run; it is not retried",
                details={"conversation": conversation_id, "owner": target, "command": command_id})

    # ------------------------------------------------------------------ the holder

    def _take(self, conn: psycopg.Connection[Any]) -> list[Command]:
        rows = conn.execute(
            "UPDATE commands SET state = 'taken' WHERE id IN (SELECT id FROM commands WHERE target = %s "
            "AND state = 'queued' AND deadline > now() ORDER BY id FOR UPDATE SKIP LOCKED) "
            "RETURNING id, conversation_id, op, request, sender", (self.owner,)).fetchall()
        return sorted((Command(i, cid, op, bytes(req), sender) for i, cid, op, req, sender in rows),
                      key=lambda cmd: cmd.id)

    def _finish(self, conn: psycopg.Connection[Any], cmd: Command, response: bytes | None, error: str) -> None:
        conn.execute("UPDATE commands SET state = %s, response = %s, error = %s, done_at = now() "
                     "WHERE id = %s AND state = 'taken'",
                     ("answered" if response is not None else "failed", response, error, cmd.id))
        notify(conn, REPLIES_CHANNEL, f"{cmd.sender} {cmd.id}")

    async def _run(self, handler: Callable[[Command], Awaitable[bytes]], cmd: Command) -> None:
        try:
            response: bytes | None = await handler(cmd)
            error = ""
        except Exception as exc:
            _log().exception("store.command_failed", conversation=cmd.conversation_id, op=cmd.op, command=cmd.id)
            response, error = None, f"{type(exc).__name__}: {exc}"
        with trio.CancelScope(shield=True):  # the sender waits for this row
            await self.pool.run(self._finish, cmd, response, error)

    async def serve(self, handler: Callable[[Command], Awaitable[bytes]], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the commands addressed to us and run ``await handler(cmd)`` for each, concurrently, until cancelled.

        ``handler`` returns the response bytes (an error the sender should see is a response too);
        if it raises, the command is ``failed`` with its text. Database failures are logged
        (``store.mailbox_failed``) and retried after a second.
        """
        with self.listener.watch(COMMANDS_CHANNEL) as incoming:
            task_status.started()
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        taken = await self.pool.run(self._take)
                    except (c.AgentdError, psycopg.Error) as exc:
                        _log().error("store.mailbox_failed", error=str(exc))
                        await trio.sleep(1.0)
                        continue
                    for cmd in taken:
                        nursery.start_soon(self._run, handler, cmd)
                    if taken:
                        continue
                    while (n := await incoming.next()) is not None and n.payload != self.owner:
                        pass  # another host's command

    async def sweep(self, *, older_than_s: float = 3600.0) -> int:
        """Delete commands that ended (answered, failed, expired) over ``older_than_s`` ago, and those
        whose deadline passed that long ago (taken by a host that died); how many."""
        rows = await self.pool.execute(
            "DELETE FROM commands WHERE (state IN ('answered', 'failed', 'expired') "
            "AND done_at < now() - %(age)s * interval '1 second') "
            "OR deadline < now() - %(age)s * interval '1 second' RETURNING id", {"age": older_than_s})
        return len(rows)
