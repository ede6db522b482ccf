"""Several agentd hosts on one shared store (``[store] backend = "postgres"``): what a host does
with the others. See docs/scale-out.md for the topology and what a person sees.

The rules (issue 20, and the agent-server seed's leases with TTL and takeover):

* **One writer per conversation.** Only the host holding a conversation's lease (by the
  database's clock) loads it: writes its journal and record and drives its runtime. Loading one
  that a live other host holds raises :class:`~agentd.leases.LeaseHeld` (``busy``).
* **Every host reads every conversation.** Records another host writes reach this one by
  ``NOTIFY agentd_record`` (``ls``/``show`` see them at once); a journal another host writes is
  read from the database up to its committed head before any read of it here (``history``,
  ``export``, a subscriber's catch-up), and committed rows are relayed to this host's subscribers
  as ``NOTIFY agentd_journal`` announces them: one relay step reads the rows after what this host
  has, takes them into the journal and publishes them in one synchronous step, so a subscriber
  (which catches up to the journal's last seq, then goes live) sees no gap and no duplicate.
* **Commands reach the runtime's host.** ``send``, ``steer``, ``cancel`` and ``answer`` for a
  conversation this host does not hold are carried through the database's ``commands`` table
  (:class:`~agentd.store.postgres.Mailbox`) to the lease holder, or, when nobody holds it, to the
  live host of the conversation's ``site``; that host answers with the very frame its own client
  would get. A conversation whose site no live host serves gets an error naming the site: its
  runtime's session state is on that host's disk, so no other host opens it.
* **A dead host is noticed by its leases.** Every ``ttl_s / 3`` each host looks for leases that
  expired (their holder stopped renewing). For a conversation whose journal shows a turn (or a
  queued prompt) in flight, it takes the lease over, ends that turn ``run_interrupted`` (never
  resending its prompt, exactly as a restart's recovery does), then gives the lease back: the
  conversation waits for its own site's agentd to come back. An idle one's lease is just deleted:
  nothing is journaled and nothing is loaded.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import msgspec
import structlog
import trio

from .. import contract as c
from .. import masking, wire
from .._keyed_lock import KeyedLock
from ..leases import LeaseHeld
from ..store.postgres import SiteDown

__all__ = ["CARRIED", "Peers"]

log = structlog.get_logger("agentd.hosts")

#: requests on a conversation that any host answers from the database
LOCAL_READS = frozenset({wire.Subscribe, wire.Export, wire.History})
#: host tools belong to the connection that registered them, on the host whose runtime calls them
HOST_TOOLS = frozenset({wire.RegisterTool, wire.UnregisterTool, wire.NextToolCall, wire.ToolResult,
                        wire.ListHostTools, wire.CallHostTool})
#: every other request on a conversation is answered by the host that runs it (its runtime, its
#: memory, its host-local files: checkpoints, whole tool outputs), by the request's tag
CARRIED: dict[type, str] = {
    t: t.__struct_config__.tag for t in typing.get_args(wire.Request)
    if "conversation" in t.__struct_fields__ and t not in LOCAL_READS | HOST_TOOLS}
#: of those, the ones that touch only the record and journal: answered here when no live host runs it
LOCAL_WHEN_UNHELD = frozenset({wire.Show, wire.Close, wire.Remove, wire.SetTitle, wire.SetBudget})
#: rows read per relay round trip
RELAY_CHUNK = 2048
#: how long a carried command may take to be answered (a send answers once the prompt is accepted), s
CARRY_TIMEOUT_S = 60.0
#: a carried ``show``, s
SHOW_TIMEOUT_S = 10.0


class Peers:
    """This host's side of a shared store. Built by the store (``conversations``: the
    PgConversationStore, ``leases``: PgLeaseStore, ``listener``: a Listener on the journal, record,
    commands and replies channels, ``mailbox``); :meth:`attach` gives it the daemon's service, hub
    and server; :meth:`run` serves until cancelled.
    """

    def __init__(self, *, conversations: Any, leases: Any, listener: Any, mailbox: Any, owner: str, site: str,
                 journal_channel: str, records_channel: str, tasks: Any = None) -> None:
        self.conversations = conversations
        self.leases = leases
        self.listener = listener
        self.mailbox = mailbox
        self.owner = owner
        self.site = site
        #: agentd.hosts.tasks.SharedTasks, for the daemon's TaskService
        self.tasks = tasks
        self._journal_channel = journal_channel
        self._records_channel = records_channel
        #: what the server hands to :meth:`carry` before answering it itself
        self.carried = frozenset(CARRIED) | HOST_TOOLS
        self.service: Any = None
        self.hub: Any = None
        self.server: Any = None
        #: one relay step at a time per conversation
        self._relaying: KeyedLock[str] = KeyedLock()
        #: conversations whose lease this host found lost (leases.on_lost), to forget
        self._lost_in, self._lost_out = trio.open_memory_channel[str](math.inf)
        leases.on_lost = self._lost_in.send_nowait

    def attach(self, service: Any, hub: Any, server: Any) -> None:
        self.service, self.hub, self.server = service, hub, server
        service.shared = self
        service.site = self.site
        self.conversations.fence = self.owner  # journal rows commit only while this host holds the lease
        self.leases.providers = service.runtimes.names()  # in this host's row: who may claim what
        server.peers = self

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, follow records and journals, serve carried commands and watch for dead hosts."""
        assert self.service is not None, "Peers.attach() first"
        async with trio.open_nursery() as nursery:
            await nursery.start(self.listener.run)
            await nursery.start(self._follow_records)
            await nursery.start(self._relay_journals)
            await nursery.start(self.mailbox.serve, self._serve_command)
            nursery.start_soon(self._watch_leases)
            nursery.start_soon(self._forget_lost)
            task_status.started()

    # ------------------------------------------------------------------ reading what others write

    async def _follow_records(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.listener.watch(self._records_channel) as watch:
            await self._reread_records()  # what changed between the service's load and the watch
            task_status.started()
            async for note in watch:  # until the listener stops
                try:
                    if note is None:
                        await self._reread_records()
                    else:
                        cid = note.payload
                        self.service.remote_record(cid, await self.conversations.read_record(cid))
                except Exception as exc:  # a background loop: never takes the daemon down
                    log.warning("hosts.record_refresh_failed", error=str(exc))

    async def _reread_records(self) -> None:
        records = await self.conversations.read_records()
        for cid, data in records.items():
            self.service.remote_record(cid, data)
        for record in self.service.list(include_closed=True):
            if record.id not in records and not self.service.is_loaded(record.id):
                # Gone, or made here after that read: only its own read can tell.
                self.service.remote_record(record.id, await self.conversations.read_record(record.id))

    async def _relay_journals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.listener.watch(self._journal_channel) as watch:
            task_status.started()
            async for note in watch:  # until the listener stops
                if note is None:  # some may have been missed: every followed conversation
                    cids = [r.id for r in self.service.list(include_closed=True) if self.hub.subscribers(r.id)]
                else:
                    cids = [note.payload.rpartition(":")[0]]
                for cid in cids:
                    if self.hub.subscribers(cid) and not self.service.is_loaded(cid):
                        try:
                            await self.relay(cid)
                        except Exception as exc:  # the next notification, or a reader, tries again
                            log.warning("hosts.relay_failed", conversation=cid, error=str(exc))

    async def relay(self, cid: str) -> int:
        """Bring this host's copy of a journal another host writes up to its committed head, publishing
        each row to this host's subscribers as it is taken; the journal's last seq after it."""
        async with self._relaying(cid):
            journal = await self.conversations.open(cid)
            while not self.service.is_loaded(cid):
                rows = await self.conversations.committed_after(cid, journal.last_seq, RELAY_CHUNK)
                if not rows or self.service.is_loaded(cid):
                    break
                # One synchronous step: the seq subscribers catch up to, and what is published past it.
                journal.adopt(rows)
                self.hub.publish_many(cid, [(seq, masking.mask_json(line)) for seq, line in rows])
                if len(rows) < RELAY_CHUNK:
                    break
            return journal.last_seq

    async def before_read(self, cid: str) -> None:
        """Hook of ConversationService.reader: the journal read up to its committed head."""
        await self.relay(cid)

    async def before_load(self, cid: str) -> None:
        """Hook of ConversationService._load, once this host holds the lease: the journal and the
        record as the last holder left them (a record older than its journal caught up with it)."""
        await self.relay(cid)
        record = self.service.remote_record(cid, await self.conversations.read_record(cid))
        if record is None:
            raise c.NotFound(f"no conversation {cid!r}")
        await self.service.catch_up(record)

    # ------------------------------------------------------------------ commands for the runtime's host

    async def carry(self, request: Any) -> bytes | None:
        """The answer frame of ``request`` (one of :data:`CARRIED`) from the host that runs its
        conversation, or None when that is this host (the caller runs it). Raises NotFound,
        Closed (no live host serves the conversation's site), Unsupported (a host tool op for a
        conversation another host runs), HolderSilent, SubmissionUncertain."""
        cid = self.service.resolve(request.conversation)
        if self.service.is_loaded(cid):
            return None
        target = site = None
        lease = await self.leases.get(cid)
        if lease is not None and not lease.expired:
            if lease.owner == self.owner:
                return None
            target = lease.owner
        else:
            site = self.service.record(cid).site
            if not site or site == self.site:
                return None  # ours to open
        if type(request) in HOST_TOOLS:
            if site is not None and not any(h.alive and h.site == site for h in await self.leases.hosts()):
                raise self._site_down(cid, site)
            raise c.Unsupported(
                f"conversation {cid} runs on another agentd host ({self.service.record(cid).site}): host tools "
                "are registered with, and called through, the agentd that runs it; connect to that one",
                details={"conversation": cid})
        timeout_s = SHOW_TIMEOUT_S if type(request) is wire.Show else CARRY_TIMEOUT_S
        try:
            # An unheld conversation goes to its site's live host, looked up in the post's own transaction.
            return await self.mailbox.call(cid, CARRIED[type(request)], wire.encode(request), timeout_s=timeout_s,
                                           target=target, site=site)
        except SiteDown:
            if type(request) in LOCAL_WHEN_UNHELD:
                return await self._answer_for_site(cid, request)
            raise self._site_down(cid, site or "") from None

    @staticmethod
    def _site_down(cid: str, site: str) -> c.Closed:
        return c.Closed(
            f"conversation {cid} runs on agentd {site}, which is not running: its runtime's session "
            "is on that host's disk; start agentd there (it can be read from here meanwhile)",
            details={"conversation": cid, "site": site})

    async def _answer_for_site(self, cid: str, request: Any) -> bytes:
        """A record-only request (:data:`LOCAL_WHEN_UNHELD`) on a conversation whose site's agentd is
        not running, answered here from the record and journal; the conversation is then given back
        (unloaded, its lease released), else this host would keep it and be carried the site's
        requests when that agentd is back, with no runtime session for it here."""
        conn = types.SimpleNamespace(peer=f"agentd {self.owner} (for {self.service.record(cid).site})")
        try:
            result = await self.server._handlers[type(request)](conn, request)
        except c.AgentdError as exc:
            return masking.mask_json(wire.encode_error(request.id, exc))
        finally:
            with trio.CancelScope(shield=True):
                if self.service.is_loaded(cid) and cid in self.leases.held():
                    try:
                        await self.service.unload(cid)
                    except Exception:  # its lease then expires; another host's watch gives it back
                        log.exception("hosts.unload_failed", conversation=cid)
        return masking.mask_json(wire.encode_result(request.id, result))

    async def _serve_command(self, cmd: Any) -> bytes:
        """Run a command another host carried here; the answer frame its client gets."""
        try:
            request = wire.decode_request(cmd.request)
        except wire.ProtocolError as exc:
            return wire.encode_error(exc.request_id, exc)
        if type(request) not in CARRIED or CARRIED[type(request)] != cmd.op:
            return wire.encode_error(request.id, c.Invalid(f"{type(request).__name__} is not carried between hosts"))
        try:
            if self.service.resolve(request.conversation) != cmd.conversation_id:
                raise c.Invalid("the command names another conversation than it was carried for")
            # Answered here even if another host holds it now: the service loads it (LeaseHeld: busy).
            conn = types.SimpleNamespace(peer=f"agentd {cmd.sender}")
            result = await self.server._handlers[type(request)](conn, request)
        except c.AgentdError as exc:
            return masking.mask_json(wire.encode_error(request.id, exc))
        return masking.mask_json(wire.encode_result(request.id, result))

    async def hosts(self) -> wire.HostsResult:
        """Every registered instance, with the conversations it holds open now."""
        held = await self.leases.held_counts()
        return wire.HostsResult(hosts=[
            wire.HostInfo(owner=h.owner, hostname=h.hostname, pid=h.pid, site=h.site, started_at=h.started_at,
                          alive=h.alive, providers=h.providers, leases=held.get(h.owner, 0), this=h.owner == self.owner)
            for h in await self.leases.hosts()])

    # ------------------------------------------------------------------ dead hosts

    async def _forget_lost(self) -> None:
        """A conversation whose lease this host lost (it stalled past the TTL; another host took it
        over and ended its turn) is dropped here without writing anything more, its record and
        journal then followed from the database like any other host's."""
        async for cid in self._lost_out:
            try:
                await self.service.forget(cid, await self.conversations.read_record(cid))
                if self.hub.subscribers(cid):
                    await self.relay(cid)
            except Exception:  # a background loop: never takes the daemon down
                log.exception("hosts.forget_failed", conversation=cid)

    async def _watch_leases(self) -> None:
        interval = max(self.leases.ttl_s / 3, 0.1)
        while True:
            try:
                for lease in await self.leases.expired():
                    try:
                        await self._take_over(lease.key, lease.owner)
                    except Exception:  # this one next round; the others now
                        log.exception("hosts.take_over_failed", conversation=lease.key)
            except Exception as exc:
                log.warning("hosts.lease_watch_failed", error=str(exc))
            await trio.sleep(interval)

    async def _take_over(self, cid: str, owner: str) -> None:
        if self.service.is_loaded(cid):
            return
        data = await self.conversations.read_record(cid)
        if data is None:  # a lease of a conversation deleted meanwhile
            await self.leases.clear_expired(cid, owner)
            return
        # Was a turn running? The record may be older than the journal (a turn's start is its prompt record).
        seen = msgspec.json.decode(data, type=wire.ConversationRecord)
        await self.relay(cid)  # the journal's committed head (what catch_up compares the record with)
        await self.service.catch_up(seen)
        if not seen.active_run and not seen.queued:
            # Nothing to end: the lease just goes, and the conversation stays unloaded (it costs nothing).
            await self.leases.clear_expired(cid, owner)
            return
        try:
            record = await self.service.recover(cid)
        except LeaseHeld:
            return  # another host was first
        log.warning("hosts.taken_over", conversation=cid, previous_owner=owner, site=record.site)
        if record.site and record.site != self.site:
            await self.service.unload(cid)  # it waits for its own site's agentd
