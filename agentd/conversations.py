"""The conversation service: records, turns, interactions and their policies.

Owns every conversation the daemon knows: its record on disk, its journal,
its lease, the provider conversation behind it, and the in-flight turn. It
knows nothing of sockets: it publishes records through the :class:`~agentd.hub.Hub`.

Rules kept here (from the provider contract):

* A conversation belongs to the daemon. A client that goes away leaves its
  turn running.
* A prompt is journaled *before* it reaches the provider; after a crash the turn
  is recorded as ``run_interrupted`` and the prompt is never resent.
* The journal is the source of truth; the record is a checkpoint of it (``journal_end``).
  A turn's start is its prompt record and its end its terminal ``turn`` record; the
  record's save at the end, and at a pending interaction's running <-> requires_action,
  is written behind (:mod:`agentd.write_behind`), and recovery brings an older record up
  to date from the journal's tail (:meth:`_catch_up`). What the journal does not hold
  (creation, settings, close, title) is saved at once.
* Nobody answers an interaction on the user's behalf, except yolo mode, which
  answers permission requests only, only with the allow-once option, and the
  journal says it was automatic. A pending interaction may expire by policy
  (``interactions.timeout_s``): it is then denied, recorded ``by: timeout``.
* ``SubmissionUncertain`` is surfaced to the caller and never retried.
* A runtime that lost a conversation's session gets a fresh one only where the journal
  shows it held no context (no completed turn); else the send fails saying the context
  is lost (agentd.lost_sessions). Either way before the prompt reached a runtime.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import attachments as _attachments
from . import contract as c
from . import itemids as _itemids
from . import lost_sessions as _lost_sessions
from . import masking
from . import models as _models
from . import runtime_output
from . import slash_commands as _slash
from . import tool_outputs as _tool_outputs
from . import turnwatch as _turnwatch
from . import usage as _usage
from . import wire
from . import write_behind as _write_behind
from ._after_step import AfterStep
from ._keyed_lock import KeyedLock
from ._quick_lock import QuickLock
from .hub import Hub, Line, LiveRun
from .journal import FsyncPolicy
from .leases import LeaseHeld
from .titles import runtime_title, title_from_prompt, user_title

from .config import AttachmentsConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .config import BudgetConfig
    from .runtimes import Runtimes
    from .store import ConversationStore, Journal, Leases

log = structlog.get_logger("agentd.conversations")

_S = wire.ConversationState
_record_decoder = msgspec.json.Decoder(wire.ConversationRecord)
_json = runtime_output.encoder  # never fails on a lone surrogate from a runtime
_encode = msgspec.json.Encoder().encode  # _json's fast path, for the per-delta path (which falls back to _json)

#: How long after start-up the first sweep of old attachments runs, seconds.
SWEEP_DELAY_S = 2.0
#: The pump handles at most this many queued events, or for this long, before it yields.
PUMP_BATCH = 1024
PUMP_SLICE_S = 0.002
#: Consecutive text deltas the pump hands to _stream at once (the slice is checked between runs).
PUMP_RUN = 64
#: A text delta emitted while the pump is idle is handled in the emitter's task (_Sink.emit), unless
#: less than this many seconds passed since deltas were last handled (so, or by the pump): then it
#: is part of a burst (one step of the emitter, the lines of one read, a runtime streaming on as fast
#: as the pump publishes), which the pump takes as one run, published in one go.
INLINE_GAP_S = 50e-6
#: How long ``send(if_busy="interrupt")`` waits for the cancelled turn to end, seconds.
INTERRUPT_WAIT_S = 10.0
#: How long the pump holds a conversation's events while an answer is handed to its provider
#: (so the reply the answer starts follows the answer's record), seconds at most.
RESPOND_HOLD_S = 5.0
#: Turn end reason when the journal refused the turn's records (disk full, read-only, fsync error).
JOURNAL_WRITE_FAILED = "journal_write_failed"
#: Turn end reason when the provider sent nothing for ``hang_timeout_s`` (and nobody was asked anything).
RUNTIME_HUNG = _turnwatch.RUNTIME_HUNG


_now_cache: list[Any] = [-1, ""]  # [unix ms, its text]


def _now() -> str:
    """Now, UTC, RFC 3339 with milliseconds (``2024-05-01T12:00:00.123Z``); formatted once per ms."""
    ms = time.time_ns() // 1_000_000
    cache = _now_cache
    if ms != cache[0]:
        cache[0] = ms
        cache[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    return cache[1]


#: type -> (unix ms, the encoded start of a live record of that type and ms, up to its data)
_line_heads: dict[str, tuple[int, bytes]] = {}
_line_tail: list[Any] = [None, b""]  # [run, the encoded end of a live record of that run, after its data]


def _live_line(type_: str, data: bytes, run: str) -> bytes:
    """``_json.encode(wire.Record(type=type_, ts=_now(), data=msgspec.Raw(data), run=run))``, the same bytes.

    Built from pieces kept per type and ms (the head) and per run (the tail): a stream of
    text deltas costs one join per record instead of a Record and an encode.
    """
    head, tail = _line_ends(type_, run)
    return b"".join((head, data, tail))


def _line_ends(type_: str, run: str) -> tuple[bytes, bytes]:
    """What precedes and what follows the data in a live record of ``type_`` and ``run`` made now (see _live_line)."""
    ms = time.time_ns() // 1_000_000  # as _now() does, without the call
    head = _line_heads.get(type_)
    if head is None or head[0] != ms:
        ts = _now()
        head = _line_heads[type_] = (_now_cache[0], b'{"type":%s,"ts":%s,"data":' % (_json.encode(type_), _json.encode(ts)))
    tail = _line_tail
    if tail[0] != run:
        tail[1] = b',"run":%s}' % _json.encode(run) if run else b"}"
        tail[0] = run
    return head[1], tail[1]


def _one_item(deltas: list[c.Delta]) -> bool:
    """Whether every delta of ``deltas`` has the first one's item id, agent and kind."""
    n = len(deltas)
    for values in ([d.item_id for d in deltas], [d.agent_id for d in deltas], [d.kind for d in deltas]):
        if values.count(values[0]) != n:
            return False
    return True


#: (item_id, agent_id, kind) -> the encoded delta of that item around its text (see _delta_template)
_templates: dict[tuple[str, str, c.ItemKind], tuple[bytes, bytes] | None] = {}
_TEXT = b',"text":""'


def _delta_template(d: c.Delta) -> tuple[bytes, bytes] | None:
    """(before, after) the encoded text in ``_encode(d)``; None when d's other fields do not encode (a lone surrogate).

    The text field is the one place ``,"text":""`` can appear in the encoding of ``d`` with
    an empty text (inside an encoded string every quote is escaped), so splitting there is exact.
    """
    key = (d.item_id, d.agent_id, d.kind)
    template = _templates.get(key, False)
    if template is False:
        try:
            empty = _encode(msgspec.structs.replace(d, text=""))
        except UnicodeEncodeError:
            template = None
        else:
            at = empty.index(_TEXT)
            template = (empty[:at + len(_TEXT) - 2], empty[at + len(_TEXT):])
        if len(_templates) >= _TEMPLATES_MEMO:
            _templates.clear()
        _templates[key] = template
    return template


#: At most this many items' templates are kept; then the memo starts over.
_TEMPLATES_MEMO = 1024


def new_id(prefix: str) -> str:
    """A short random id: ``prefix`` + 12 hex digits (48 bits)."""
    return prefix + secrets.token_hex(6)


def _payload(event: c.Event) -> tuple[str, bytes]:
    """(record type, encoded payload) of a provider event."""
    tag = type(event).__struct_config__.tag
    fields = type(event).__struct_fields__
    if len(fields) == 1:
        return tag, _json.encode(getattr(event, fields[0]))
    return tag, _json.encode({f: getattr(event, f) for f in fields})


class _Unsynced(c.InternalError):
    """A record is in the journal but its sync failed: not known to be durable. Never written again:
    the file journal takes no more records (Journal.sync), the postgres store retries the commit."""


class _Events:
    """A conversation's queue of provider events for its pump: unbounded, FIFO, one reader.

    What a ``trio.open_memory_channel(math.inf)`` pair did here, lighter: :meth:`put` runs
    once per provider event (every streamed delta) and is a deque append. ``put`` after
    :meth:`close` raises ClosedResourceError; :meth:`get` returns what was put before the
    close, then raises EndOfChannel, and checkpoints every call (as ``receive`` does), so a
    busy pump still yields between bursts.
    """

    __slots__ = ("_items", "_waiter", "_closed")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: trio.Event | None = None
        self._closed = False

    def put(self, event: Any) -> None:
        if self._closed:
            raise trio.ClosedResourceError
        self._items.append(event)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()

    def close(self) -> None:
        self._closed = True
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    def waiting(self) -> bool:
        """Whether the consumer is parked in :meth:`get` with nothing queued: no event is
        queued or being handled, so one handled right now overtakes none."""
        return self._waiter is not None

    def get_nowait(self) -> Any:
        """The next event; raises WouldBlock when there is none (yet), EndOfChannel once closed and drained."""
        if self._items:
            return self._items.popleft()
        raise trio.EndOfChannel if self._closed else trio.WouldBlock

    def put_delta(self, delta: c.Delta) -> None:
        """Queue a text delta: onto the run of deltas at the tail (a :class:`_Deltas`, up to PUMP_RUN), else as a new one.

        The pump takes a run with one ``get``: no per-delta event in the queue, none taken one by one.
        """
        if self._closed:
            raise trio.ClosedResourceError
        items = self._items
        if items:
            last = items[-1]
            if type(last) is _Deltas and len(last) < PUMP_RUN:
                last.append(delta)  # not empty: the reader is not waiting
                return
        self.put(_Deltas((delta,)))

    async def get(self) -> Any:
        """The next event, waiting for one; EndOfChannel once closed and drained."""
        if self._items or self._closed:
            await trio.lowlevel.checkpoint()  # a busy pump yields between bursts
        # else the wait below is the checkpoint: a checkpoint first would be a second scheduler
        # pass per wake-up of an idle pump (per chunk a runtime writes)
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._waiter = waiter = trio.Event()
            await waiter.wait()
        return self._items.popleft()


_DeltaEvent = c.DeltaEvent
_perf_counter = time.perf_counter


class _Deltas(list):  # type: ignore[type-arg]
    """Consecutive text deltas queued for the pump as one item (see _Events.put_delta)."""

    __slots__ = ()


class _Sink:
    """The EventSink a provider conversation reports through: never blocks.

    The queue (_Events) is unbounded on purpose: a provider may not be slowed down,
    and every durable event must reach the journal. Memory stays bounded by
    what one turn of a provider produces; subscribers are bounded separately.
    """

    def __init__(self, live: "_Live") -> None:
        self._live = live
        self._events = live.events  # a live's queue is never replaced
        self._put_delta = live.events.put_delta
        #: which run the provider works on, as it emits (see agentd.turnwatch)
        self.tagger = _turnwatch.Tagger()
        #: the pump's handling of text deltas, done in the caller's task while the pump is idle
        #: (set with the pump; see emit)
        self.stream_now: Callable[[list[c.Delta]], None] | None = None
        #: perf_counter() when deltas were last handled, in emit or by the pump (see INLINE_GAP_S)
        self.streamed_at = 0.0
        #: the keepers whose processes act for the conversation now, as its provider says (runs_under)
        self.keepers: Callable[[], frozenset[int]] = frozenset

    def runs_under(self, keepers: Callable[[], frozenset[int]]) -> None:
        """The provider says where the conversation runs (agentd.providers._common.runs_under)."""
        self.keepers = keepers

    def emit(self, event: c.Event) -> None:
        if type(event) is _DeltaEvent:  # what tag() does with a delta, inlined: this runs per streamed delta
            if self.tagger.muted:
                return
            if self._events.waiting() and self.stream_now is not None and not self._live.responding:
                # The pump is idle, so nothing queued could be overtaken: a delta that comes alone
                # (a runtime streaming a chunk at a time) is handled here, as the pump would
                # (synchronously, no checkpoint), saving a wake of the pump's task per chunk.
                if _perf_counter() - self.streamed_at >= INLINE_GAP_S:
                    self.stream_now([event.delta])
                    self.streamed_at = _perf_counter()  # its end: a slow fan-out is no gap
                    return
                # Right after another: a burst, which the pump takes as one run.
            try:
                self._put_delta(event.delta)
            except trio.ClosedResourceError:
                log.debug("conversation.event_after_close", conversation=self._live.record.id)
            return
        tagged = self.tagger.tag(event)
        if tagged is None:
            return
        try:
            self._live.events.put(tagged)
        except trio.ClosedResourceError:
            log.debug("conversation.event_after_close", conversation=self._live.record.id)


class _Live:
    """The in-memory side of one loaded conversation."""

    def __init__(self, record: wire.ConversationRecord, journal: "Journal") -> None:
        self.record = record
        self.journal = journal
        self.conv: c.Conversation | None = None
        self.events = _Events()
        self.sink = _Sink(self)
        self.published_seq = journal.last_seq
        #: records journaled whose sync is awaited before they are published (fsync always), in seq order
        self.syncing: list[tuple[int, bytes]] = []
        #: records held back while the pump handles a burst or a turn starts, published together at its
        #: end (or before anything waits: publish_held); None: publish at once
        self.held: list[tuple[int, Line]] | None = None
        self.pending: dict[str, c.Interaction] = {}
        #: interactions the daemon answered itself (yolo, timeout), until the provider resolves them
        self.auto_answered: set[str] = set()
        #: interactions whose answer is being handed to the provider -> the provider's resolution
        #: that came meanwhile (journaled after the answer record, so the answer comes first)
        self.responding: dict[str, tuple[str, bytes, str] | None] = {}
        #: set once no answer is being handed over any more (the pump waits for it: _answer_first)
        self.responded: trio.Event | None = None
        #: text so far of the turn's streamed items: id -> (kind, agent_id, chunks)
        self.items: dict[str, tuple[str, str, list[str]]] = {}
        #: streamed text held back while it could be the start of a secret (agentd.masking)
        self.deltas = masking.DeltaMasker()
        self.todos: c.TodoList | None = None
        self.activity: c.Activity | None = None
        self.context: c.Context | None = None
        self.usage: c.Usage | None = None
        self.queue: deque[tuple[str, str]] = deque()  # (run, text)
        #: attachments of queued prompts, by run
        self.queued_attachments: dict[str, list[c.Attachment]] = {}
        #: the running turn is being cancelled because spend reached the budget
        self.budget_cut = False
        #: the conversation is being closed because spend reached a budget with on_reach stop
        self.budget_closing = False
        self.turn_done = trio.Event()
        self.turn_done.set()
        #: an interrupting send waits for the cancelled turn; queued prompts wait for it
        self.interrupting = False
        self.open_lock = QuickLock()
        self.send_lock = QuickLock()
        #: the last journal write failed (logged once until one succeeds again)
        self.write_failing = False
        #: the run being failed because its journal cannot be written, and why
        self.failing_run = ""
        self.fail_error = ""
        self.fail_reason = ""
        #: trio time of the provider's last event (the hang watchdog's clock)
        self.last_event = 0.0
        #: the run whose provider conversation is being opened before its prompt is sent
        #: (a runtime starting, a restart backoff): a cancel meanwhile ends it at once
        self.opening_run = ""
        #: the run that ended last (its stragglers' item ids are scoped by it)
        self.last_run = ""
        #: runtime item ids scoped by run (agentd.itemids)
        self.item_ids = _itemids.ItemIds()
        #: how the last few runs ended (a cancel reports it)
        self.ended: dict[str, wire.CancelResult] = {}
        #: another host took the lease over while this one stalled (ConversationService.forget):
        #: nothing more of this one is journaled, published or saved
        self.lost = False
        #: ending records (type, data, run) the journal refused and subscribers were told live: journaled
        #: first once it takes records again (a store whose failed commits are retried)
        self.unjournaled: list[tuple[str, bytes, str]] = []

    @property
    def run(self) -> str:
        return self.record.active_run


class _Reader:
    """A conversation as a subscriber reads it, loaded or not: its record and journal.

    Reading takes no lease and starts nothing, so tailing an idle
    conversation leaves it unloaded. ``published_seq`` is the loaded
    conversation's when it is loaded (it may get loaded meanwhile), else the
    journal's last seq (nothing appends to an unloaded conversation).
    """

    __slots__ = ("record", "journal", "_lives")

    def __init__(self, record: wire.ConversationRecord, journal: "Journal", lives: dict[str, _Live]) -> None:
        self.record = record
        self.journal = journal
        self._lives = lives

    @property
    def published_seq(self) -> int:
        live = self._lives.get(self.record.id)
        return live.published_seq if live is not None else self.journal.last_seq


class ConversationService:
    """Every conversation of this daemon; see the module docstring for the rules.

    Methods raise the contract's errors (:class:`~agentd.contract.NotFound`,
    :class:`~agentd.contract.Busy`, :class:`~agentd.contract.Invalid`,
    :class:`~agentd.contract.Closed`, :class:`~agentd.contract.InteractionGone`,
    :class:`~agentd.contract.SubmissionUncertain`, ...), which the server maps
    one to one to wire error codes.
    """

    def __init__(
        self,
        *,
        store: "ConversationStore",
        leases: "Leases",
        runtimes: "Runtimes",
        hub: Hub,
        fsync: FsyncPolicy = FsyncPolicy.BATCH,
        interaction_timeout_s: float = 0.0,
        hang_timeout_s: float = 0.0,
        silence_timeout_s: float = 0.0,
        cancel_timeout_s: float = INTERRUPT_WAIT_S,
        owner: str = "",
        pricing: "Mapping[str, _usage.Price] | None" = None,
        budgets: "Mapping[str, BudgetConfig] | None" = None,
        attachments: "AttachmentsConfig | None" = None,
        tool_output_quota_bytes: int = _tool_outputs.DEFAULT_QUOTA_BYTES,
    ) -> None:
        self.store = store
        if hasattr(store, "on_recovered"):  # a journal that takes records again after failed commits
            store.on_recovered = self._journal_recovered
        self.leases = leases
        self.runtimes = runtimes
        self.hub = hub
        self.fsync = fsync
        #: records are synced before they are published: always with fsync "always", and on a
        #: store where an appended record would not survive a crash of this process (agentd.store)
        self._sync_before_publish = fsync is FsyncPolicy.ALWAYS or not store.capabilities.crash_safe_append
        self.interaction_timeout_s = interaction_timeout_s
        self.hang_timeout_s = hang_timeout_s
        self.silence_timeout_s = silence_timeout_s
        self.cancel_timeout_s = cancel_timeout_s
        self.owner = owner
        #: [pricing."<model>"], [budgets.<provider>], [attachments] of the config
        self.pricing = dict(pricing or {})
        self.budgets = dict(budgets or {})
        self.attachments = attachments or AttachmentsConfig()
        #: whole tool outputs whose records carry a display cut (agentd.tool_outputs)
        self.tool_outputs = _tool_outputs.ToolOutputs(store.root, tool_output_quota_bytes)
        #: record -> the MCP servers its runtime gets at open (the daemon sets agentd.mcp's)
        self.mcp_servers: Callable[[wire.ConversationRecord], list[c.McpServer]] = lambda record: []
        self._records: dict[str, wire.ConversationRecord] = {}
        self._live: dict[str, _Live] = {}
        #: conversations being loaded, each under its lock
        self._loading: KeyedLock[str] = KeyedLock()
        #: conversations a dead holder left, being ended by :meth:`recover`, each under its lock
        self._recovering: KeyedLock[str] = KeyedLock()
        #: on a store shared by several hosts (agentd.hosts.Peers), set by the daemon: what brings a
        #: conversation another host wrote up to date before this one reads or loads it
        self.shared: Any = None
        #: the record of a conversation this host lost, by id (see forget): never saved again
        self._forgotten: dict[str, wire.ConversationRecord] = {}
        #: this host's site on a shared store (agentd.hosts), kept in the records it creates; "" on files
        self.site = ""
        self._nursery: trio.Nursery | None = None
        #: set while agentd.reload replaces runtimes (hold_starts): turn starts and provider opens wait
        self._swapping: trio.Event | None = None
        #: agentd.checkpoints.Checkpoints, set by the daemon (None: no checkpoints are taken)
        self.checkpoints: Any = None
        #: records owing a save whose news the journal holds (a turn's end): written behind
        self.write_behind = _write_behind.WriteBehind()
        #: a turn's held start records, published once the prompt is written (or sooner: see there)
        self.publish_soon: AfterStep[_Live] = AfterStep(self._publish_if_held)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Load records, recover interrupted turns, then serve until cancelled.

        On cancellation, open provider conversations are closed (shielded, a
        few seconds at most); journals are flushed by the store's owner.
        """
        await self._load_records()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._recover()
            nursery.start_soon(self._retention_loop)
            nursery.start_soon(self.write_behind.run, self._save_behind)
            await nursery.start(self.publish_soon.run)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + 5
                    owed = set(self.write_behind.owed())
                    for live in list(self._live.values()):
                        if live.run or live.record.queued or live.record.id in owed:
                            # The checkpoint catches up with the journal: the records index a clean
                            # stop writes is then exact, and the next start reads no journal.
                            self._save_quietly(live.record)
                        if live.conv is not None:
                            try:
                                await live.conv.close()
                            except Exception:
                                log.exception("conversation.close_failed", conversation=live.record.id)
                    # Leave the lease to expire? No: release it, we stopped cleanly.
                    for cid in list(self._live):
                        try:
                            await self.leases.release(cid)
                        except Exception:
                            log.exception("lease.release_failed", conversation=cid)

    async def _load_records(self) -> None:
        records = await self.store.read_records()  # one index file after a clean stop
        for cid in sorted(records):
            data = records[cid]
            try:
                self._records[cid] = _record_decoder.decode(data)
            except msgspec.DecodeError as exc:
                log.error("conversation.record_unreadable", conversation=cid, error=str(exc))

    async def _recover(self) -> None:
        """Take over conversations whose turn was running when a previous daemon died.

        Idempotent across crashes: a run whose terminal ``turn`` is already
        journaled (the daemon died before saving the record, or during an
        earlier recovery) gets no second one. A conversation that cannot be
        recovered (corrupt journal, write error) is logged and left as it is;
        the daemon serves the others.
        """
        caught_up = self.store.records_from_index  # a clean stop saved every record it had in flight
        for record in list(self._records.values()):
            if not caught_up:
                try:
                    if await self._catch_up(record) and not self.store.capabilities.shared \
                            and not record.active_run and not record.queued:
                        # What the tail said is saved (else the index a clean stop writes would hide
                        # it again). On a shared store the record is its holder's to write.
                        self._save_quietly(record)
                except c.Refused:
                    pass  # damage the store already logged, in one line
                except (c.AgentdError, OSError) as exc:
                    log.error("turn.recovery_failed", conversation=record.id, run=record.active_run,
                              error=getattr(exc, "message", None) or str(exc))
            if not record.active_run and not record.queued:
                continue
            try:
                await self._recover_one(record)
            except c.Refused:
                pass
            except LeaseHeld as exc:  # a shared store: another live host runs it (agentd.hosts)
                log.info("conversation.held_elsewhere", conversation=record.id, owner=exc.lease.owner)
            except (c.AgentdError, OSError) as exc:
                log.error("turn.recovery_failed", conversation=record.id, run=record.active_run,
                          error=getattr(exc, "message", None) or str(exc))

    async def _recover_one(self, record: wire.ConversationRecord) -> None:
        live = await self._load(record.id)
        record = live.record  # on a shared store, loading re-read it (the last holder's)
        if not record.active_run and not record.queued:
            return  # it ended meanwhile
        runs = [r for r in (record.active_run, *record.queued) if r]
        log.warning("turn.interrupted", conversation=record.id, run=record.active_run, queued=list(record.queued))
        # Pending interactions of the dead turn can never be answered now.
        try:
            lines = await live.journal.read_after(self._run_start_seq(record))
        except c.AgentdError as exc:
            log.error("journal.unreadable", conversation=record.id, error=exc.message)
            lines = []
        pending: dict[str, c.Interaction] = {}
        tools: dict[tuple[str, str], c.Item] = {}  # the active run's tool items, latest record of each
        ended: set[str] = set()
        usage: c.Usage | None = None
        active_end: tuple[int, c.Turn] | None = None  # the active run's end, when it is journaled
        for line in lines:
            rec = wire.decode_record(line)
            if rec.run not in runs:
                continue
            if rec.type == "usage":
                usage = msgspec.json.decode(rec.data, type=c.Usage)  # the record is saved at the turn's end only
            elif rec.type == "interaction":
                inter = msgspec.json.decode(rec.data, type=c.Interaction)
                if inter.state is c.InteractionState.PENDING:
                    pending[inter.id] = inter
                else:
                    pending.pop(inter.id, None)
            elif rec.type == "item" and rec.run == record.active_run:
                item = msgspec.json.decode(rec.data, type=c.Item)
                if item.tool is not None:
                    tools[(item.agent_id, item.id)] = item
            elif rec.type == "turn" and (turn := msgspec.json.decode(rec.data, type=c.Turn)).state.terminal:
                ended.add(rec.run)
                if rec.run == record.active_run:
                    active_end = (rec.seq, turn)
        for run in runs:
            if run in ended:
                continue
            if run == record.active_run:
                for inter in pending.values():
                    expired = msgspec.structs.replace(
                        inter, state=c.InteractionState.EXPIRED, resolution=c.RUN_INTERRUPTED
                    )
                    await self._append(live, "interaction", _json.encode(expired), run=run)
                for item in _unfinished_tools(tools.values()):
                    await self._append(live, "item", _json.encode(item), run=run)
                error = "agentd stopped while this turn was running; the prompt was not resent"
            else:
                error = "agentd stopped before this queued prompt was sent; it was not sent"
            turn = c.Turn(state=c.TurnState.FAILED, reason=c.RUN_INTERRUPTED, error=error)
            await self._append(live, "turn", _json.encode(turn), run=run)
            ended.add(run)  # one end a run, even if the record lists it twice (active and queued)
        record.active_run = ""
        record.queued = []
        record.state = _S.IDLE
        if active_end is not None:  # it ended before the record was saved: as _end_turn left it
            record.turn_after = active_end[0]
            record.error = active_end[1].error if active_end[1].state is c.TurnState.FAILED else ""
        if usage is not None:
            record.usage = usage
        self._save(record)

    async def _catch_up(self, record: wire.ConversationRecord) -> bool:
        """Bring a record that is older than its journal up to date with the journal's tail.

        The record is a checkpoint (a turn's end is written behind, a turn's start is its prompt
        record): of the tail past it, the last ``usage`` record gives the running total, the
        last terminal ``turn`` gives ``turn_after`` and ``error`` as the turn's end set them,
        and prompts whose run has no terminal turn there become the active run (or, never
        started, queued ones), for :meth:`_recover_one` to end ``run_interrupted``. A run the
        record names whose end is in the tail is left to :meth:`_recover_one`, which adds no
        second end. One stat per conversation; the journal is read only when it grew past the
        checkpoint. Returns whether the record changed.
        """
        if record.journal_end < 0 or await self.store.journal_size(record.id) <= record.journal_end:
            return False
        journal = await self.store.open(record.id)
        started: dict[str, bool] = {}  # run -> it got further than its prompt
        prompted: dict[str, int] = {}  # run -> its prompt's seq
        ended: set[str] = set()
        usage: c.Usage | None = None
        last_end: tuple[int, c.Turn] | None = None
        for line in await journal.read_after(record.journal_seq):
            rec = wire.decode_record(line)
            if rec.type == "usage":
                usage = msgspec.json.decode(rec.data, type=c.Usage)  # the running total, not a delta
                continue
            if not rec.run:
                continue
            if rec.type == "prompt":
                if rec.run not in started and rec.run not in ended:
                    prompted[rec.run] = rec.seq
                    queued = msgspec.json.decode(rec.data, type=wire.PromptRecord).disposition == "queued"
                    started[rec.run] = not queued
            elif rec.type == "turn" and (turn := msgspec.json.decode(rec.data, type=c.Turn)).state.terminal:
                started.pop(rec.run, None)
                ended.add(rec.run)
                last_end = (rec.seq, turn)
            elif rec.run in started:
                started[rec.run] = True
        changed = False
        if usage is not None and usage != record.usage:
            record.usage, changed = usage, True
        if last_end is not None and not record.active_run:
            # (An active run the record names is _recover_one's: it reads the run from turn_after.)
            record.turn_after = last_end[0]  # as _end_turn set it: the seq of the end
            record.error = last_end[1].error if last_end[1].state is c.TurnState.FAILED else ""
            changed = True
        record.journal_end, record.journal_seq = journal.size, journal.last_seq  # read up to here
        if not started:
            return changed
        log.info("conversation.caught_up", conversation=record.id, runs=list(started))
        if record.active_run in ended:
            record.active_run = ""  # its end is in the tail: the first open run is active now
            if record.state is _S.RUNNING:
                record.state = _S.IDLE
        if not record.active_run:
            record.turn_after = min(prompted[run] for run in started) - 1  # as _start set it
        for run, ran in started.items():
            if ran and not record.active_run:
                record.active_run = run
            elif run != record.active_run and run not in record.queued:
                record.queued.append(run)
        record.state = _S.RUNNING
        return True

    def _run_start_seq(self, record: wire.ConversationRecord) -> int:
        return max(0, record.turn_after)

    # ------------------------------------------------------------------ records

    def _save(self, record: wire.ConversationRecord, *, flush: bool = True) -> None:
        live = self._live.get(record.id)
        if live is None and self._forgotten.get(record.id) is record:
            return  # the copy of a conversation this host lost (see forget): the new holder writes it
        if self._records.get(record.id) is not record:
            # Removed (a task still holding it, say an open that was under way): never written again.
            log.debug("conversation.save_skipped", conversation=record.id)
            return
        self.write_behind.discard(record.id)  # this save carries whatever one owed said
        if live is not None and flush:
            self._flush(live)  # records held back go out first: the write below blocks on fsyncs
        self.store.write_record(record.id, self._checkpoint(record, live))

    def _checkpoint(self, record: wire.ConversationRecord, live: _Live | None) -> bytes:
        """The bytes of ``record`` as saved now (masked), its journal position updated from ``live``."""
        if live is not None:
            # The checkpoint says how far into the journal it reaches (recovery reads on from there).
            record.journal_end, record.journal_seq = live.journal.size, live.journal.last_seq
        record.updated_at = _now()
        return masking.mask_json(_json.encode(record))

    async def _save_behind(self, cid: str) -> None:
        """The save :attr:`write_behind` owed ``cid``, off the event loop; errors are logged (the
        journal still holds what it would have said)."""
        live = self._live.get(cid)
        if live is None or live.lost:
            return  # unloaded (saved then) or lost to another host (its record now)
        try:
            await self.store.write_record_async(cid, self._checkpoint(live.record, live))
        except OSError as exc:
            log.error("conversation.record_write_failed", conversation=cid, error=str(exc))

    def _save_quietly(self, record: wire.ConversationRecord, *, flush: bool = True) -> bool:
        """``_save`` for bookkeeping that must go on when the disk refuses (full, read-only):
        logs the error, returns False. The record in memory stays authoritative."""
        try:
            self._save(record, flush=flush)
            return True
        except OSError as exc:
            log.error("conversation.record_write_failed", conversation=record.id, error=str(exc))
            return False

    def resolve(self, ref: str) -> str:
        """The conversation id ``ref`` names: an exact id or a unique prefix.

        Raises NotFound, or Invalid when the prefix is ambiguous.
        """
        if ref in self._records:
            return ref
        matches = [cid for cid in self._records if cid.startswith(ref)] if ref else []
        if not matches:
            refused = [cid for cid in self.store.refused if cid.startswith(ref)] if ref else []
            if len(refused) == 1:  # on disk, but its record is not one agentd wrote
                raise self.store.refused[refused[0]]
            raise c.NotFound(f"no conversation {ref!r}")
        if len(matches) > 1:
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            raise c.Invalid(f"{ref!r} is ambiguous: {', '.join(sorted(matches)[:5])}{more} (type more of the id)")
        return matches[0]

    def record(self, ref: str) -> wire.ConversationRecord:
        return self._records[self.resolve(ref)]

    def list(self, *, include_closed: bool = False) -> list[wire.ConversationRecord]:
        records = sorted(self._records.values(), key=lambda r: r.created_at)
        if not include_closed:
            records = [r for r in records if r.state is not _S.CLOSED]
        return records

    def running(self) -> int:
        return sum(1 for r in self._records.values() if r.active_run)

    def closed(self) -> int:
        """How many conversations are closed (``ls`` lists them only with ``--all``)."""
        return sum(1 for r in self._records.values() if r.state is _S.CLOSED)

    def __len__(self) -> int:
        return len(self._records)

    async def create(
        self, *, provider: str, workdir: str, title: str = "", model: str = "", effort: str = "",
        mode: str = "interactive", budget: wire.Budget | None = None, provider_conversation_id: str = "",
        context_tier: str = "", mcp: list[str] | None = None,
    ) -> wire.ConversationRecord:
        """Create a conversation: record, journal, lease, and the provider conversation.

        ``provider_conversation_id`` binds it to that existing runtime session (agentd.adopt),
        which the provider then resumes instead of creating one: NotFound when it cannot.

        ``budget`` None takes the provider's default budget from the config
        (``[budgets.<provider>]``), if any; a budget with no ``max_cost_usd``
        means none.

        Raises NotFound for an unknown provider, RuntimeUnavailable when its
        runtime cannot start, Invalid for a bad workdir or model, or a title over
        agentd.titles.MAX_TITLE_CHARS (agentd.titles.user_title).
        """
        title = user_title(title)
        await self.runtimes.get(provider)  # unknown or broken provider: fail before writing anything
        import os

        if not os.path.isabs(workdir) or not os.path.isdir(workdir):
            raise c.Invalid(f"workdir {workdir!r} is not an existing absolute directory")
        now = _now()
        record = wire.ConversationRecord(
            id=new_id("c"),
            provider=provider,
            workdir=workdir,
            created_at=now,
            updated_at=now,
            title=title,
            model=model,
            effort=effort,
            context_tier=context_tier,
            mode=mode,  # type: ignore[arg-type]
            provider_conversation_id=provider_conversation_id,
            mcp=mcp,
            site=self.site,
        )
        record.budget, budget_source = _usage.initial_budget(budget, provider, self.budgets)
        if title:
            record.title_source = "user"
        self._records[record.id] = record  # before its first save (_save writes only what is here)
        try:
            self._save(record)
        except OSError as exc:
            self._records.pop(record.id, None)
            try:
                await self.store.remove(record.id)  # the directory made for it
            except OSError:
                pass
            raise c.InternalError(f"cannot write the conversation record: {exc.strerror or exc}") from None
        try:
            live = await self._load(record.id)
            created = wire.ConversationCreated(provider=provider, workdir=workdir, title=title, model=model, mode=mode)  # type: ignore[arg-type]
            await self._append(live, "conversation", _json.encode(created))
            if record.budget is not None:
                change = wire.BudgetRecord(budget=record.budget, source=budget_source)  # type: ignore[arg-type]
                await self._append(live, "budget", _json.encode(change))
            await self._ensure_open(live)
        except BaseException as exc:
            await self._discard(record, "conversation.create_cleanup_failed")
            if isinstance(exc, OSError):
                raise c.InternalError(f"cannot create the conversation's journal: {exc.strerror or exc}") from None
            raise
        return record

    async def _discard(self, record: wire.ConversationRecord, event: str) -> None:
        """Delete a conversation whose creation failed half-way (shielded); a failure is logged as ``event``."""
        with trio.CancelScope(shield=True):
            try:
                await self.delete(record.id)
            except c.NotFound:
                pass  # removed meanwhile (an rm while its runtime started)
            except Exception:
                log.exception(event, conversation=record.id)

    async def adopt(
        self, *, provider: str, workdir: str, title: str, model: str, effort: str, mode: str,
        budget: wire.Budget | None, provider_conversation_id: str, forked_from: str, forked_at: str,
        first: tuple[str, bytes, str], records: "list[tuple[str, bytes, str]]",
        context_tier: str = "", mcp: list[str] | None = None,
    ) -> wire.ConversationRecord:
        """Register a conversation a runtime already made (a fork, agentd.branching): save its
        record, journal ``first`` then its ``conversation`` record then ``records`` (each
        ``(type, payload, run)``), and open it on its runtime. ``context_tier`` and ``mcp`` as
        :meth:`create` takes them (a fork keeps its source's). On failure nothing of it is kept
        here; raises what :meth:`create` raises."""
        now = _now()
        record = wire.ConversationRecord(
            id=new_id("c"), provider=provider, workdir=workdir, created_at=now, updated_at=now, title=title,
            model=model, effort=effort, context_tier=context_tier, mcp=mcp, mode=mode, budget=budget,  # type: ignore[arg-type]
            provider_conversation_id=provider_conversation_id, forked_from=forked_from, forked_at=forked_at,
            title_source="user" if title else "", site=self.site)
        self._records[record.id] = record  # before its first save (_save writes only what is here)
        try:
            self._save(record)
        except OSError as exc:
            self._records.pop(record.id, None)
            raise c.InternalError(f"cannot write the conversation record: {exc.strerror or exc}") from None
        try:
            live = await self._load(record.id)
            await self._append(live, *first[:2], run=first[2])
            created = wire.ConversationCreated(provider=provider, workdir=workdir, title=title, model=model, mode=mode)  # type: ignore[arg-type]
            await self._append(live, "conversation", _json.encode(created))
            for type_, data, run in records:
                await self._append(live, type_, data, run=run)
            record.turn_after = live.published_seq
            self._save(record)
            await self._ensure_open(live)
        except BaseException as exc:
            await self._discard(record, "conversation.adopt_cleanup_failed")
            if isinstance(exc, OSError):
                raise c.InternalError(f"cannot write the conversation's journal: {exc.strerror or exc}") from None
            raise
        return record

    async def _load(self, cid: str) -> _Live:
        """The live side of a conversation, loading it (journal, lease, pump) on first use."""
        live = self._live.get(cid)
        if live is not None:
            return live
        async with self._loading(cid):  # one load at a time per conversation: one lease outcome, journaled once
            live = self._live.get(cid)
            if live is not None:
                return live
            return await self._load_locked(cid)

    async def _load_locked(self, cid: str) -> _Live:
        outcome = None
        try:
            outcome = await self.leases.acquire(cid)
        except OSError as exc:
            # A file lease is bookkeeping under the daemon lock: when the disk refuses it (full,
            # read-only) the conversation is still served, and the failure logged. A shared store's
            # lease is what keeps two hosts off one journal: its errors (LeaseHeld, StoreUnavailable)
            # propagate.
            log.error("lease.acquire_failed", conversation=cid, error=str(exc))
        if self.shared is not None:
            try:  # the last holder's records: the journal's head and the record as it left them
                await self.shared.before_load(cid)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self.leases.release(cid)
                raise
        record = self._records[cid]
        journal = await self.store.open(cid)
        live = _Live(record, journal)
        self._live[cid] = live
        assert self._nursery is not None, "ConversationService.run() is not running"
        self._nursery.start_soon(self._pump, live)
        live.sink.stream_now = functools.partial(self._stream_now, live)
        try:
            if outcome is not None and outcome.action == "taken_over":
                lease = wire.LeaseRecord(action="taken_over", owner=self.owner, previous_owner=outcome.previous_owner)
                await self._append(live, "lease", _json.encode(lease))
            elif outcome is not None and outcome.action == "acquired" and journal.last_seq:
                lease = wire.LeaseRecord(action="acquired", owner=self.owner)
                await self._append(live, "lease", _json.encode(lease))
        except c.InternalError:
            pass  # the journal refused the lease record: logged by _append
        return live

    async def live(self, ref: str, *, open_only: bool = False) -> _Live:
        """The conversation, loaded (which takes its lease). ``open_only``: Closed for a closed
        one, said before it is loaded. Raises NotFound, Invalid (see :meth:`resolve`)."""
        cid = self.resolve(ref)
        loaded = self._live.get(cid)
        if open_only and (loaded.record if loaded is not None else self._records[cid]).state is _S.CLOSED:
            raise c.Closed(f"conversation {cid} is closed")
        return await self._load(cid)

    async def reader(self, ref: str) -> _Live | _Reader:
        """What a subscriber reads: the loaded conversation, else its journal without loading it.

        Raises NotFound, Invalid (see :meth:`resolve`), JournalCorrupt, OSError.
        """
        cid = self.resolve(ref)
        live = self._live.get(cid)
        if live is not None:
            return live
        if self.shared is not None:  # another host may be writing it: read up to its committed head
            await self.shared.before_read(cid)
        journal = await self.store.open(cid)
        return self._live.get(cid) or _Reader(self._records[cid], journal, self._live)

    def _holds(self, live: _Live) -> bool:
        """Whether ``live`` is still this service's (not removed, nor lost to another host)."""
        return self._live.get(live.record.id) is live

    def hold_starts(self) -> Callable[[], None]:
        """From now until the returned function is called, turn starts and provider opens wait
        (agentd.reload replaces runtimes meanwhile: one opened on the runtime being replaced
        would be stopped under its turn, and kept, refuse every prompt after)."""
        gate = self._swapping = trio.Event()

        def release() -> None:
            if self._swapping is gate:
                self._swapping = None
            gate.set()

        return release

    async def _after_swap(self, live: _Live) -> None:
        """Wait while runtimes are being replaced (hold_starts); at once otherwise."""
        while (gate := self._swapping) is not None:
            self.publish_held(live)
            await gate.wait()

    async def _ensure_open(self, live: _Live) -> c.Conversation:
        if live.conv is None:
            await self._after_swap(live)  # not under open_lock: the restart's detach takes it
        if live.conv is None or live.open_lock.locked():
            self.publish_held(live)  # a runtime's start, or another opener, is waited for below
        async with live.open_lock:
            if live.conv is not None:
                return live.conv
            record = live.record
            was_closed = record.state is _S.CLOSED
            request = c.OpenRequest(
                workdir=record.workdir,
                conversation_id=record.provider_conversation_id,
                title=record.title,
                model=record.model,
                effort=record.effort,
                context_tier=record.context_tier,
                mcp_servers=self.mcp_servers(record),
            )
            try:
                conv = await self.runtimes.open(record.provider, request, live.sink)  # warm pool
            except (c.ConversationNotFound, c.SessionUnreadable) as exc:
                if not request.conversation_id:
                    if isinstance(exc, c.SessionUnreadable):
                        raise
                    raise c.NotFound(f"the provider could not open a conversation: {exc.message}") from None
                # The runtime lost its session or cannot read it back (it died before saving it, say):
                # a fresh one when nothing it kept is lost, else the error says so (agentd.lost_sessions).
                conv = await _lost_sessions.reopen_lost(self, live, request, exc)
            gone = not self._holds(live)
            if gone or (record.state is _S.CLOSED and not was_closed):
                # Removed (rm), closed, or lost to another host while its runtime started: what
                # was opened goes too (kept, it would run on for a conversation nobody holds).
                await self._close_quietly(live, conv)
                if live.lost:
                    raise c.InternalError("another agentd host holds this conversation now")
                if gone:
                    raise c.NotFound(f"conversation {record.id} was removed while its runtime started")
                raise c.Closed(f"conversation {record.id} was closed while its runtime started")
            live.conv = conv
            live.last_event = trio.current_time()  # just opened: idle from now (agentd.idle_release)
            if conv.id != record.provider_conversation_id:
                record.provider_conversation_id = conv.id
                self._save(record)
            return conv

    async def _close_quietly(self, live: _Live, conv: c.Conversation) -> None:
        """Close ``conv`` (shielded, INTERRUPT_WAIT_S at most); a failure is logged."""
        with trio.CancelScope(shield=True), trio.move_on_after(INTERRUPT_WAIT_S):
            try:
                await conv.close()
            except Exception as exc:
                log.warning("conversation.close_failed", conversation=live.record.id, error=str(exc))

    # The narrow surface agentd.models (and later rooms) use; each is the method named.
    async def open_conversation(self, live: _Live) -> c.Conversation:
        return await self._ensure_open(live)

    async def journal(self, live: _Live, type_: str, data: bytes, *, run: str | None = None) -> int:
        return await self._append(live, type_, data, run=live.run if run is None else run)

    async def reopen_later(self, ref: str) -> bool:
        """Close the provider side of an open, idle conversation, so its next turn opens it again
        (agentd.host_tools: a runtime then starts its MCP servers anew). Whether it did."""
        live = self._live.get(self.resolve(ref))
        if live is None:
            return False
        async with live.open_lock:
            conv = live.conv
            if conv is None or live.record.active_run or live.record.state is _S.CLOSED:
                log.info("conversation.reopen_later_skipped", conversation=live.record.id, open=conv is not None,
                         run=live.record.active_run, state=live.record.state.value)
                return False
            live.conv = None
            if not live.record.turn_after and not live.queue:
                # Never prompted: the runtime may not have kept the empty conversation (Codex writes
                # a thread at its first turn); the next turn creates it afresh instead of reopening.
                live.record.provider_conversation_id = ""
                self._save(live.record)
        with trio.move_on_after(INTERRUPT_WAIT_S):
            await conv.close()
        return True

    def save_record(self, record: wire.ConversationRecord) -> None:
        self._save(record)

    # ------------------------------------------------------------------ journal + publish

    async def _append(self, live: _Live, type_: str, data: bytes, *, run: str = "") -> int:
        """Journal one durable record, then publish it. Returns its seq.

        With fsync ``always`` the record is on disk before any subscriber sees
        it. A write error (disk full, read-only) fails the running turn's
        bookkeeping loudly and propagates as InternalError; the journal stays
        valid (the journal truncates a partial line).
        """
        if live.lost:
            raise c.InternalError("another agentd host holds this conversation now")
        if live.unjournaled:
            await self._append_unjournaled(live)
        data = masking.mask_json(data)  # what a runtime echoed of a secret is never written
        written = False
        try:
            seq, line = live.journal.append(type_, data, run=run)
            written = True
            if self._sync_before_publish:
                self._flush(live)  # what is held back goes out before this task yields
                live.syncing.append((seq, line))
                # Shielded: a record appended is published, or a subscriber would see a gap.
                # A failed sync leaves the record here: the file journal refuses every later sync
                # (Journal.sync), and the postgres store retries the commit, whose next sync
                # publishes it then.
                with trio.CancelScope(shield=True):
                    await live.journal.sync()
        except OSError as exc:
            if not live.write_failing:
                live.write_failing = True
                log.error("journal.write_failed", conversation=live.record.id, error=str(exc))
            raise (_Unsynced if written else c.InternalError)(
                f"cannot write the journal: {exc.strerror or exc}") from None
        if live.write_failing:
            live.write_failing = False
            log.info("journal.write_recovered", conversation=live.record.id)
        if self._sync_before_publish:
            self._publish_synced(live, seq)
        else:
            live.published_seq = seq
            self._publish(live, seq, line)
        return seq

    def _publish_synced(self, live: _Live, seq: int) -> None:
        """Publish, in seq order, every record up to ``seq`` whose sync was awaited.

        A sync puts every record appended before it on disk, so what other tasks
        journaled before ``seq`` is durable too, and goes out here even when its
        own task has not resumed yet: trio resumes two tasks woken together in
        either order, and a subscriber never gets a record published after a
        later one (the hub skips a seq at or below its cursor).
        """
        syncing = live.syncing
        n = 0
        while n < len(syncing) and syncing[n][0] <= seq:
            n += 1
        if not n:
            return  # another task's sync published it already
        ready = syncing[:n]
        del syncing[:n]
        live.published_seq = max(live.published_seq, ready[-1][0])
        for s, line in ready:
            self._publish(live, s, line)

    async def _append_or_publish(self, live: _Live, type_: str, data: bytes, *, run: str) -> None:
        """Journal a record that ends something; when the journal cannot take it, still tell
        subscribers live (seq 0), so nobody waits for an end that was not written."""
        try:
            await self._append(live, type_, data, run=run)
        except c.InternalError as exc:
            if not live.lost and not isinstance(exc, _Unsynced):  # an unsynced one is in the journal already
                live.unjournaled.append((type_, data, run))
            self._publish_live(live, type_, data, run=run)

    async def _append_unjournaled(self, live: _Live) -> None:
        """Journal the ending records the journal refused earlier, in order, before anything after
        them; raises InternalError (the rest kept) while it still refuses."""
        backlog, live.unjournaled = live.unjournaled, []
        for i, (type_, data, run) in enumerate(backlog):
            try:
                await self._append(live, type_, data, run=run)
            except c.InternalError as exc:
                live.unjournaled[:0] = backlog[i + 1 if isinstance(exc, _Unsynced) else i:]
                raise

    def _journal_recovered(self, cid: str) -> None:
        """The store's hook: ``cid``'s journal takes records again; what it refused is written now."""
        live = self._live.get(cid)
        if live is not None and live.unjournaled:
            self._spawn(self._write_unjournaled, live)

    async def _write_unjournaled(self, live: _Live) -> None:
        try:
            await self._append_unjournaled(live)
        except c.InternalError:
            return  # logged by _append; the next append or recovery tries again
        if not live.run:
            live.record.turn_after = live.published_seq
        self._save_quietly(live.record)

    def _publish_live(self, live: _Live, type_: str, data: bytes, *, run: str | None = None, masked: bool = False) -> None:
        if not masked:
            data = masking.mask_json(data)
        self._publish(live, 0, _live_line(type_, data, live.run if run is None else run))

    def _publish(self, live: _Live, seq: int, line: bytes) -> None:
        """Hand a record to the hub, or hold it back while the pump handles a burst (see _pump)."""
        if live.lost:
            return
        if live.held is not None:
            live.held.append((seq, line))
        else:
            self.hub.publish(live.record.id, seq, line)

    def _flush(self, live: _Live) -> None:
        """Publish the records held back, in order, in one go."""
        held = live.held
        if held:
            live.held = []
            self.hub.publish_many(live.record.id, held)

    def flush_held(self, cid: str) -> None:
        """Publish what a loaded conversation holds back now (its hold goes on); for a subscriber
        about to go live (agentd.server), whose catch-up read the journal to ``published_seq``,
        which counts held records: it must not get the held live-only records after those."""
        live = self._live.get(cid)
        if live is not None:
            self._flush(live)

    def _publish_if_held(self, live: _Live) -> None:
        if live.held is not None:
            self.publish_held(live)  # its holder yielded while holding

    def publish_held(self, live: _Live) -> None:
        """Publish the records held back, in order, and hold none from now on.

        Called before anything that waits (a runtime's start or answer, a git run):
        no record is held back while something slow runs. Whoever held them finds
        nothing left to flush; a hold only ever saves writes, so ending one early
        costs writes, never a record or its order.
        """
        self._flush(live)
        live.held = None

    async def _pump(self, live: _Live) -> None:
        """Consume one conversation's provider events in order: state, journal, publish.

        Events already queued are handled back to back, up to PUMP_BATCH or
        PUMP_SLICE_S, before the pump yields: a burst from the provider reaches
        each subscriber's writer as a burst, sent in one write. While an answer
        is handed to the provider, events wait for its record (_answer_first).
        """
        events = live.events
        receive_nowait = events.get_nowait
        deltas = _Deltas
        try:
            while True:
                try:
                    event = await events.get()
                except trio.EndOfChannel:
                    return
                if live.responding:
                    await self._answer_first(live)
                # Records of the burst are held back and published together at its end (the
                # hub builds each subscriber's frames in one join). Nobody can tell: no task
                # runs in between unless handling yields, and whatever yields publishes what is
                # held first (_append, publish_held); a subscriber going live flushes (flush_held).
                holding = live.held is None  # else someone holding already (an ending turn) flushes
                if holding:
                    live.held = []
                streamed = False  # a text delta was handled (by the synchronous path, see _stream)
                try:
                    deadline = 0.0
                    taken = 0
                    while True:
                        if type(event) is deltas:  # a run of text deltas (up to PUMP_RUN), together
                            taken += len(event)
                            streamed = True
                            self._stream_logged(live, event)
                        else:
                            taken += 1
                            await self._handle_logged(live, event)
                        if not deadline:
                            deadline = time.perf_counter() + PUMP_SLICE_S  # from the first handled on
                        elif time.perf_counter() > deadline:
                            break
                        if taken >= PUMP_BATCH or live.responding:  # an answer goes first: _answer_first
                            break
                        try:
                            event = receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                finally:
                    if streamed:
                        # What _handle stamps per event, once: nobody reads it before the pump yields.
                        live.last_event = trio.current_time()
                    if holding:
                        self.publish_held(live)
                    if streamed:  # published: a delta right after this is the same stream's (INLINE_GAP_S)
                        live.sink.streamed_at = _perf_counter()
        finally:
            events.close()  # as leaving ``async with`` a receive channel did: later events are dropped

    async def _answer_first(self, live: _Live) -> None:
        """Wait (RESPOND_HOLD_S at most) until the answer being handed to the provider is journaled
        (_respond): what the provider emits once it has the answer, often in the same scheduler
        pass (the reply it starts), then follows the answer's record for every subscriber."""
        done = live.responded
        if done is None:
            done = live.responded = trio.Event()
        with trio.move_on_after(RESPOND_HOLD_S):
            await done.wait()
        done.set()  # given up (a provider slow to take the answer): the events after it wait no more

    async def _handle_logged(self, live: _Live, event: c.Event) -> None:
        try:
            await self._handle(live, event)
        except c.InternalError as exc:
            # Logged where it happened. A turn whose events cannot be journaled does not go on
            # unrecorded: it is stopped and ends failed with the reason.
            run = live.run
            if live.write_failing and run and live.failing_run != run:
                live.failing_run, live.fail_error, live.fail_reason = run, exc.message, JOURNAL_WRITE_FAILED
                self._spawn(self._fail_turn, live, run)
        except Exception:
            log.exception("conversation.event_failed", conversation=live.record.id)

    async def _fail_turn(self, live: _Live, run: str) -> None:
        """The journal refused a record of ``run``: cancel the provider's turn, end it failed.

        The provider's own terminal event, if it comes, is turned into this
        failure (see _handle); if it does not come within INTERRUPT_WAIT_S the
        turn is ended here.
        """
        if live.lost:
            return
        log.error("turn.failing", conversation=live.record.id, run=run, reason=live.fail_reason, error=live.fail_error)
        if live.conv is not None:
            with trio.move_on_after(self.cancel_timeout_s):
                try:
                    await live.conv.cancel()
                except Exception as exc:
                    log.warning("turn.cancel_failed", conversation=live.record.id, run=run, error=str(exc))
        if live.run == run:
            turn = _turnwatch.inferred_end(c.TurnState.FAILED, live.fail_reason, live.fail_error)
            await self._end_turn(live, turn, run)

    def _stream_now(self, live: _Live, deltas: list[c.Delta]) -> None:
        """Text deltas handled outside the pump, which is idle (_Sink.emit): as the pump handles them."""
        live.last_event = trio.current_time()
        self._stream_logged(live, deltas)

    def _stream_logged(self, live: _Live, deltas: list[c.Delta]) -> None:
        """:meth:`_stream`, a failure logged as :meth:`_handle_logged` logs it."""
        try:
            self._stream(live, deltas)
        except Exception:
            log.exception("conversation.event_failed", conversation=live.record.id)

    def _stream(self, live: _Live, deltas: list[c.Delta]) -> None:
        """A provider's text deltas, in order: scoped, masked, published live, never journaled.

        What :meth:`_handle` does for each DeltaEvent but stamping ``last_event``
        (the caller does), synchronous: no I/O and never a checkpoint, so the
        pump takes a stream of deltas without a coroutine per delta. Consecutive
        deltas of one item (same id, agent and kind) go as a group: scoped once,
        masked at once (DeltaMasker.feed_many), each encoded as its text in the
        group's template, all stamped with one clock read (they are published
        together anyway).
        """
        run = live.record.active_run
        scope, scope_run = live.item_ids.scope_delta, run or live.last_run
        feed_many, items, held = live.deltas.feed_many, live.items, live.held
        head, tail = _line_ends("delta", run)
        i, n = 0, len(deltas)
        while i < n:
            first = deltas[i]
            item, agent, kind = first.item_id, first.agent_id, first.kind
            if not i and _one_item(deltas):
                j = n  # the common case, checked at C speed
            else:
                j = i + 1
                while j < n and (d := deltas[j]).item_id == item and d.agent_id == agent and d.kind is kind:
                    j += 1
            group = deltas[i:j] if i or j < n else deltas
            i = j
            scoped = scope(first, scope_run)
            key = scoped.item_id
            keep = None if key == item else (lambda d, key=key: msgspec.structs.replace(d, item_id=key))
            texts = [d.text for d in group]
            # a secret split across deltas never goes out
            out = feed_many(key, texts, group, keep)
            if out is not texts:  # some text held back or masked: an emptied one is not sent
                out = [o for o, t in zip(out, texts) if o or o is t]
                if not out:
                    continue
            entry = items.get(key)
            if entry is None:  # the item's first text sent
                items[key] = (kind.value, agent, list(out))
            else:
                entry[2].extend(out)  # joined only for a snapshot: appends stay O(1)
            template = _delta_template(scoped)
            if template is not None:
                pre, post = head + template[0], template[1] + tail
                try:
                    datas = list(map(_encode, out))
                except UnicodeEncodeError:
                    datas = [_json.encode(t) for t in out]  # a lone surrogate: the odd-bytes rule (runtime_output)
            else:
                pre, post = head, tail
                datas = [_json.encode(msgspec.structs.replace(scoped, text=t)) for t in out]
            if held is not None:
                # no line made per delta: the hub joins each subscriber's frames of the run
                held.append((0, LiveRun(pre, datas, post)))
            else:  # one by one, as published at once (each to the outbox's rule for one frame)
                for data in datas:
                    self.hub.publish(live.record.id, 0, b"".join((pre, data, post)))

    def _delta(self, live: _Live, d: c.Delta, data: bytes) -> None:
        """Keep ``d``'s text for a snapshot and publish ``data`` (``d`` encoded, masked already)."""
        entry = live.items.get(d.item_id)
        if entry is None:
            entry = live.items[d.item_id] = (d.kind.value, d.agent_id, [])
        entry[2].append(d.text)  # joined only for a snapshot: appends stay O(1)
        self._publish(live, 0, _live_line("delta", data, live.run))

    def _release_deltas(self, live: _Live, item_id: str | None) -> None:
        """Send the text agentd.masking held back: the item is complete, or the turn ends."""
        held = live.deltas.flush_all() if item_id is None else [live.deltas.flush(item_id)]
        for d, text in filter(None, held):
            if text:
                d = msgspec.structs.replace(d, text=text)
                self._delta(live, d, _json.encode(d))

    async def _handle(self, live: _Live, event: c.Event | _turnwatch.End | _turnwatch.Exited) -> None:
        live.last_event = trio.current_time()
        if isinstance(event, c.DeltaEvent):  # the pump takes these by _stream itself; same thing
            self._stream(live, [event.delta])
            return
        run = live.run
        exit_run = ""  # for an ExitEvent: the run whose provider turn was open when it was emitted
        exit_stale = False  # for an ExitEvent: a prompt went to the same provider conversation since
        if type(event) is _turnwatch.Exited:
            exit_run, exit_stale, event = event.run, event.stale(live.sink.tagger), event.event
        if type(event) is _turnwatch.End:
            if _turnwatch.late_end(live, event):
                return  # its run already ended here: never a second terminal record
            if self.checkpoints is not None and run and event.run == run:
                # The after-state is journaled before the end (bounded): the end stays the run's last record.
                await self.checkpoints.after_turn(self, live, run)
                if _turnwatch.late_end(live, event):
                    return  # ended meanwhile (a cancel that stopped waiting for the provider)
            event = event.event
        else:
            event = live.item_ids.scope(event, run or live.last_run)
        if isinstance(event, c.ToolOutputEvent):
            await self._keep_output(live, event)  # before its item is journaled; never journaled itself
            return
        if type(event) is c.ItemEvent and \
                len(event.item.text) > runtime_output.MAX_ITEM_TEXT_CHARS + runtime_output.CUT_NOTE_ROOM:
            # Whatever the provider kept, an item is journaled within the bound every reader takes.
            event = msgspec.structs.replace(
                event, item=msgspec.structs.replace(event.item, text=runtime_output.cut_text(event.item.text)))
        type_, data = _payload(event)
        if isinstance(event, c.ActivityEvent):
            live.activity = event.activity
            self._publish_live(live, type_, data)
            return
        if isinstance(event, c.ContextEvent):
            live.context = event.context
            self._publish_live(live, type_, data)
            return
        if isinstance(event, c.TodosEvent):
            live.todos = event.todos
            self._publish_live(live, type_, data)
            return

        if isinstance(event, (c.ItemEvent, c.TurnEvent, c.ExitEvent)):
            self._release_deltas(live, event.item.id if isinstance(event, c.ItemEvent) else None)
        if isinstance(event, c.ItemEvent):
            item = event.item
            if item.id in live.items:
                live.items[item.id] = (item.kind.value, item.agent_id, [item.text])
        elif isinstance(event, c.UsageEvent):
            # The journal's ``usage`` records are the daemon's running totals (see agentd.usage).
            await _usage.account(self, live, run, report=event.usage)
            return
        elif isinstance(event, c.TokensEvent):
            await self._append(live, type_, data, run=run)
            await _usage.account(self, live, run, tokens=event.tokens)
            return
        elif isinstance(event, c.TitleEvent):
            title = runtime_title(event.title)
            if title == live.record.title:
                return  # the provider confirming a title set here, already journaled
            if live.record.title_source == "user":
                return  # a person named it; the provider's own title does not replace that
            if title != event.title:
                type_, data = "title", _json.encode(title)
            live.record.title = title
            live.record.title_source = "provider"
            self._save_quietly(live.record)
        elif isinstance(event, c.InteractionEvent):
            inter = event.interaction
            if inter.state is c.InteractionState.PENDING:
                auto = self._yolo_option(live, inter)
                if auto is not None:
                    inter = msgspec.structs.replace(inter, auto=True)
                    data = _json.encode(inter)
                live.pending[inter.id] = inter
                await self._append(live, type_, data, run=run)
                if auto is not None:
                    self._spawn(self._auto_answer, live, inter, c.Answer(decision=auto), "yolo")
                else:
                    self._set_state(live, _S.REQUIRES_ACTION)
                    if self.interaction_timeout_s > 0:
                        self._spawn(self._expire_later, live, inter.id)
                return
            live.pending.pop(inter.id, None)
            if inter.id in live.auto_answered and not inter.auto:
                live.auto_answered.discard(inter.id)
                data = _json.encode(msgspec.structs.replace(inter, auto=True))
            if not live.pending and live.record.state is _S.REQUIRES_ACTION:
                self._set_state(live, _S.RUNNING)
            if inter.id in live.responding:
                live.responding[inter.id] = (type_, data, run)  # _respond journals it after the answer
                return
        elif isinstance(event, c.TurnEvent):
            turn = event.turn
            if not turn.state.terminal:
                if live.record.state is not _S.REQUIRES_ACTION:
                    self._set_state(live, _S.RUNNING)
                await self._append(live, type_, data, run=run)
                return
            if run and run == live.failing_run:
                turn = _turnwatch.inferred_end(c.TurnState.FAILED, live.fail_reason, live.fail_error, turn.model)
            await self._end_turn(live, turn, run)
            return
        elif isinstance(event, c.ExitEvent):
            if not exit_stale:  # else it took a prompt after the exit, on a runtime of its own starting
                live.conv = None
            await self._append(live, type_, data, run=run)
            if live.run and exit_run == live.run:
                turn = c.Turn(state=c.TurnState.FAILED, error=event.error, reason="runtime_exit")
                await self._end_turn(live, turn, live.run, journal_turn=True)
            # Else the current run's prompt did not reach that runtime before it exited (a queued
            # run handed over as the crashed turn ended, maybe before this was handled): it goes,
            # or went, to a new one.
            return
        await self._append(live, type_, data, run=run)

    async def _keep_output(self, live: _Live, event: c.ToolOutputEvent) -> None:
        self.publish_held(live)  # nothing held back waits for the worker thread below
        try:
            await trio.to_thread.run_sync(self.tool_outputs.keep, live.record.id, event.agent_id, event.item_id,
                                          event.output)
        except (OSError, ValueError) as exc:  # the record's cut still says what is missing
            log.error("tool_output.write_failed", conversation=live.record.id, item=event.item_id, error=str(exc))

    async def _end_turn(self, live: _Live, turn: c.Turn, run: str, *, journal_turn: bool = True) -> None:
        if not run:
            # A terminal turn with no turn of ours in flight (a duplicate end): journal, no state change.
            await self._append(live, "turn", _json.encode(turn))
            return
        if run in live.record.queued:
            live.record.queued.remove(run)  # a queued run ended before its start (cancelled, say)
        turn = _usage.cut_short_turn(live, turn)
        holding = live.held is None
        if holding:
            live.held = []
        try:
            # Written if the journal can take them, else told live: the turn ends either way.
            for inter in list(live.pending.values()):
                expired = msgspec.structs.replace(inter, state=c.InteractionState.EXPIRED, resolution="turn ended")
                await self._append_or_publish(live, "interaction", _json.encode(expired), run=run)
            live.pending.clear()
            if journal_turn:
                await self._append_or_publish(live, "turn", _json.encode(turn), run=run)
            live.failing_run = live.fail_error = live.fail_reason = ""
            _turnwatch.note_end(live, run, turn)
            live.last_run = run
            live.items.clear()
            live.activity = None
            live.record.active_run = ""
            # Idle from the end on (agentd.idle_release), an end agentd decided included (a silent
            # runtime, a cancel not confirmed, a prompt that failed to send): no event stamps those.
            live.last_event = trio.current_time()
            live.record.turn_after = live.published_seq
            live.record.state = _S.CLOSED if live.record.state is _S.CLOSED else _S.IDLE
            live.record.error = turn.error if turn.state is c.TurnState.FAILED else ""
        finally:
            if holding:
                self.publish_held(live)
        # The end is in the journal: the record follows behind it (a crash in between is harmless,
        # as recovery brings the record up to date from the journal's tail and adds no end).
        if live.unjournaled or not self.store.capabilities.blocking_records:
            self._spawn(self._save_after_end, live)  # the end's only mark, or a save that costs no wait
        else:
            self.write_behind.mark(live.record.id)
        if self.checkpoints is not None:
            self.checkpoints.turn_ended(self, live, run)  # an end agentd decided: after it, returns at once
        live.turn_done.set()
        if live.record.state is not _S.CLOSED and _usage.reached(live):
            await _usage.turn_ended(self, live)
            return
        if live.queue and live.record.state is not _S.CLOSED and not live.interrupting:
            next_run, text = live.queue.popleft()
            # Handed over at once: a prompt sent before the queued one starts is queued behind it,
            # never started ahead of it (which also left the provider busy under the next start).
            self._make_active(live.record, next_run)
            self._spawn(self._start_queued, live, next_run, text)

    @staticmethod
    def _make_active(record: wire.ConversationRecord, run: str) -> None:
        """``run`` becomes the active one, and is no longer queued: a record saved from now on
        (a crash may follow) never lists it as both. Its start is the conversation's last update
        (what ``ls`` sorts by), in memory at once; saved with the record."""
        record.active_run = run
        record.updated_at = _now()
        if run in record.queued:
            record.queued.remove(run)

    async def _save_after_end(self, live: _Live) -> None:
        """Save the record of a turn at once (its end the journal refused: the record is its only
        mark; or a store whose save does not block), once the end was sent: the subscribers'
        writers are woken by its publication, and one checkpoint lets them send it before this
        blocks. Saves even when cancelled (shutdown) at that checkpoint.
        """
        try:
            await trio.lowlevel.checkpoint()
        finally:
            self._save_quietly(live.record)

    def _set_state(self, live: _Live, state: wire.ConversationState) -> None:
        """A running turn's state (running <-> requires_action) in the record.

        Once the record checkpoints a journal position, the save is written behind, as a turn's
        end is: the journal holds why (the interaction's records), and recovery ends the active
        run whatever state the older record says. Saved at once otherwise (a store whose records
        do not block, a journal that refused records: then the record is the only mark).
        """
        if live.record.state is not state and live.record.state is not _S.CLOSED:
            live.record.state = state
            if live.record.journal_end >= 0 and self.store.capabilities.blocking_records and not live.unjournaled:
                self.write_behind.mark(live.record.id)
            else:
                self._save_quietly(live.record)

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------------ interactions

    @staticmethod
    def _yolo_option(live: _Live, inter: c.Interaction) -> str | None:
        """The option yolo picks: allow-once on a permission, else None (a person decides)."""
        if live.record.mode != "yolo" or inter.kind is not c.InteractionKind.PERMISSION:
            return None
        for option in inter.options:
            if option.allow_once and not option.reject:
                return option.id
        return None

    async def _auto_answer(self, live: _Live, inter: c.Interaction, answer: c.Answer, by: str) -> None:
        try:
            await self._respond(live, inter.id, answer, auto=True, by=by)
        except c.AgentdError as exc:
            log.warning("interaction.auto_answer_failed", conversation=live.record.id, by=by, error=exc.message)

    async def _expire_later(self, live: _Live, interaction_id: str) -> None:
        await trio.sleep(self.interaction_timeout_s)
        inter = live.pending.get(interaction_id)
        if inter is None:
            return
        if inter.kind is c.InteractionKind.PERMISSION:
            deny = next((o.id for o in inter.options if o.reject), None)
            answer = c.Answer(decision=deny) if deny else c.Answer(reject=True)
        elif inter.kind is c.InteractionKind.QUESTION:
            answer = c.Answer(reject=True)
        else:
            answer = c.Answer(plan=c.PlanAnswer(feedback="No answer in time; the plan was not approved."))
        await self._auto_answer(live, inter, answer, "timeout")

    async def answer(self, ref: str, interaction_id: str, answer: c.Answer, *, by: str = "") -> None:
        """Answer a pending interaction for a person.

        ``interaction_id`` may be a unique prefix. Raises InteractionGone when
        it is not pending, Invalid when the answer does not fit it (nothing
        reaches the provider then).
        """
        live = await self.live(ref)
        matches = [i for i in live.pending if i == interaction_id or i.startswith(interaction_id)]
        if interaction_id in live.pending:
            matches = [interaction_id]
        if not matches:
            raise c.InteractionGone(f"interaction {interaction_id!r} is not pending")
        if len(matches) > 1:
            raise c.Invalid(f"interaction {interaction_id!r} is ambiguous")
        await self._respond(live, matches[0], answer, auto=False, by=by)

    async def _respond(self, live: _Live, interaction_id: str, answer: c.Answer, *, auto: bool, by: str) -> None:
        inter = live.pending.get(interaction_id)
        if inter is None:
            raise c.InteractionGone(f"interaction {interaction_id!r} is not pending")
        c.validate_answer(inter, answer)
        if auto:
            live.auto_answered.add(interaction_id)
        if live.conv is None:
            raise c.InteractionGone("the provider conversation ended; the interaction can no longer be answered")
        live.responding[interaction_id] = None
        try:
            await live.conv.respond(interaction_id, answer)
            # Journaled after the provider took it: an answer it refused is not recorded as given.
            rec = c.AnswerRecord(interaction_id=interaction_id, answer=answer, auto=auto, by=by)
            await self._append(live, "answer", _json.encode(rec), run=live.run)
        finally:
            # The provider's resolution, if it came meanwhile, goes after the answer (a reader sees
            # who answered first), or alone when the answer failed.
            resolution = live.responding.pop(interaction_id, None)
            if resolution is not None:
                with trio.CancelScope(shield=True):
                    await self._append_or_publish(live, resolution[0], resolution[1], run=resolution[2])
            if not live.responding and live.responded is not None:
                live.responded.set()  # the pump goes on (_answer_first)
                live.responded = None

    # ------------------------------------------------------------------ turns

    async def send(
        self, ref: str, text: str, *, if_busy: str = "reject", attachments: "list[wire.Upload] | None" = None
    ) -> wire.SendResult:
        """Send a prompt; what happens while a turn runs follows ``if_busy``.

        reject -> Busy; queue -> runs after the current turn (and any queued
        before it); steer -> added to the running turn; interrupt -> the
        running turn is cancelled (waits up to INTERRUPT_WAIT_S for it to
        end), then this prompt starts. Returns once the provider accepted the
        prompt (or it was queued). Raises Closed, Busy, SubmissionUncertain,
        RuntimeUnavailable, NotFound; LimitExceeded while the conversation is
        at its budget (paused, or reached during the running turn).

        ``attachments`` are stored under the conversation first
        (:mod:`agentd.attachments`; Invalid or LimitExceeded past the
        ``[attachments]`` limits, Unsupported when the provider takes none),
        then journaled with the prompt and handed to the provider with it.
        The first prompt of an untitled conversation also titles it.
        """
        if not text.strip():
            raise c.Invalid("the prompt is empty")
        live = await self.live(ref)
        if live.record.state is _S.CLOSED:
            raise c.Closed(f"conversation {live.record.id} is closed")
        _usage.refuse_at_budget(live)
        if if_busy == "steer" and not (await self.runtimes.get(live.record.provider)).capabilities().steer:
            # Said before anything is stored or sent, turn running or not: a script learns it at once.
            raise c.Unsupported(f"provider {live.record.provider} cannot steer a running turn (--if-busy steer)")
        await _slash.check(self, live, text)  # a /command the runtime does not offer: Invalid
        stored: list[c.Attachment] = []
        if attachments:
            if live.run and if_busy == "reject":
                raise c.Busy(f"a turn is running in {live.record.id} (run {live.run})")
            stored = await self._store_uploads(live, attachments)
        async with live.send_lock:
            if live.run:
                if if_busy == "reject":
                    raise c.Busy(f"a turn is running in {live.record.id} (run {live.run})")
                if if_busy == "queue":
                    run = new_id("r")
                    prompt = wire.PromptRecord(text=text, disposition="queued", attachments=_journaled(stored))
                    # On disk before the prompt is journaled, as for a started one: a crash
                    # before it runs ends it run_interrupted on restart.
                    live.record.queued.append(run)
                    try:
                        if live.record.journal_end >= 0:
                            self.store.drop_index()  # the prompt record is the durable mark (see _start)
                        else:
                            self._save(live.record)
                        after = await self._append(live, "prompt", _json.encode(prompt), run=run) - 1
                    except BaseException as exc:
                        live.record.queued.remove(run)
                        if isinstance(exc, OSError):
                            raise c.InternalError(f"cannot write the conversation record: {exc.strerror or exc}") from None
                        raise
                    live.queue.append((run, text))
                    if stored:
                        live.queued_attachments[run] = stored
                    return wire.SendResult(run=run, disposition="queued", after=after)
                if if_busy == "steer":
                    await self._steer(live, text, stored)
                    return wire.SendResult(run=live.run, disposition="steered", after=live.published_seq)
                # interrupt: this prompt goes next, ahead of any queued ones
                live.interrupting = True
                try:
                    await _turnwatch.cancel(self, live)
                finally:
                    live.interrupting = False
                if live.run:
                    raise c.Busy("the running turn did not end after it was cancelled")
                run = new_id("r")
                after = await self._start(live, run, text, journal_prompt=True, attachments=stored)
                return wire.SendResult(run=run, disposition="interrupted", after=after)
            if not live.record.title and not live.record.turn_after:
                await self._title_from_prompt(live, text)
            run = new_id("r")
            after = await self._start(live, run, text, journal_prompt=True, attachments=stored)
            return wire.SendResult(run=run, disposition="started", after=after)

    async def _start_queued(self, live: _Live, run: str, text: str) -> None:
        attachments = live.queued_attachments.pop(run, [])
        async with live.send_lock:
            if live.run != run:
                return  # the hand-off was undone
            if live.record.state is _S.CLOSED:
                turn = c.Turn(state=c.TurnState.CANCELLED, reason="closed",
                              error="the conversation was closed before this queued prompt was sent")
                await self._end_turn(live, turn, run)
                return
            try:
                await self._start(live, run, text, journal_prompt=False, attachments=attachments)
            except c.AgentdError as exc:
                log.warning("turn.queued_start_failed", conversation=live.record.id, run=run, error=exc.message)
                if live.run == "" and live.queue and live.record.state is not _S.CLOSED:
                    next_run, next_text = live.queue.popleft()
                    self._make_active(live.record, next_run)
                    self._spawn(self._start_queued, live, next_run, next_text)

    async def _start(
        self, live: _Live, run: str, text: str, *, journal_prompt: bool, attachments: "list[c.Attachment] | None" = None
    ) -> int:
        """Mark the turn active on disk, journal the prompt, then hand it to the provider.

        Returns the seq before the prompt. The record says the run is active
        before the prompt is journaled, so a crash at any point after that
        ends the run ``run_interrupted`` on restart and never leaves a prompt
        without an outcome. When the record or the prompt cannot be written
        (disk full, read-only), nothing reached the provider: the conversation
        stays idle and InternalError says why.

        The turn's start records (its prompt, the checkpoint before it) are
        held back and published together, one write per subscriber, until the
        prompt is handed to the provider; every step on the way that has to
        wait (a runtime's start, a git run, a queued model change) publishes
        them first (:meth:`publish_held`), so no watcher waits for them.
        """
        await self._after_swap(live)  # before the run is active: a restart's detach may close its conversation
        holding = live.held is None  # else someone holding already publishes them
        if holding:
            live.held = []
        try:
            return await self._start_turn(live, run, text, journal_prompt, attachments)
        finally:
            if holding:
                self.publish_held(live)

    async def _start_turn(
        self, live: _Live, run: str, text: str, journal_prompt: bool, attachments: "list[c.Attachment] | None"
    ) -> int:
        """What :meth:`_start` says, its start records held back (or not) by the caller."""
        after = live.published_seq
        record = live.record
        self._make_active(record, run)
        record.turn_after = after
        record.state = _S.RUNNING
        record.error = ""
        live.turn_done = trio.Event()
        try:
            if journal_prompt and record.journal_end >= 0:
                # The prompt record is the durable start: recovery finds it past the record's
                # checkpoint. Only the index of a clean stop, which would hide it, goes first.
                self.store.drop_index()
            else:
                self._save(record)  # no checkpoint of a journal position yet: the record says it
            if journal_prompt:
                prompt = wire.PromptRecord(text=text, attachments=_journaled(attachments or []))
                await self._append(live, "prompt", _json.encode(prompt), run=run)
        except BaseException as exc:
            record.active_run = ""
            record.state = _S.IDLE
            live.turn_done.set()
            try:
                self._save(record)
            except OSError as save_exc:
                log.error("conversation.record_write_failed", conversation=record.id, error=str(save_exc))
            if isinstance(exc, OSError):
                log.error("conversation.record_write_failed", conversation=record.id, error=str(exc))
                raise c.InternalError(f"cannot write the conversation record: {exc.strerror or exc}") from None
            raise
        opened = False
        try:
            live.opening_run = run
            try:
                conv = await self._ensure_open(live)
            finally:
                if live.opening_run == run:
                    live.opening_run = ""
            opened = True
            if live.run != run:
                # The turn ended (cancelled, closed, failed) while its conversation was being
                # opened: its prompt never reaches the provider. What was opened stays for the next one.
                await self._abandoned_open(live, run)
                return after
            conv = await _turnwatch.settle(self, live, conv)
            if live.run != run:
                await self._abandoned_open(live, run)
                return after
            await _models.apply_queued(self, live, conv)  # a set-model --after-turn
            if self.checkpoints is not None:
                await self.checkpoints.before_turn(self, live, run)  # bounded; never raises
                if live.run != run:
                    await self._abandoned_open(live, run)
                    return after
            prompt = c.Prompt(text=text, attachments=list(attachments or []))
            # A provider's send may wait for its runtime: the start records go out then, at the
            # next scheduler pass; usually it writes the prompt in this step, and they follow it.
            self.publish_soon.defer(live)
            try:
                await self._submit(live, run, conv, prompt)
            except (c.ConversationNotFound, c.SessionUnreadable) as exc:
                # The provider found, before it sent anything, that its runtime came back without
                # the session (or unable to read it): reopen (agentd.lost_sessions decides how) and
                # hand it over once more.
                log.warning("turn.session_lost_at_send", conversation=live.record.id, run=run, error=exc.message)
                conv = await self._reopen_after_loss(live, conv)
                if live.run != run:
                    await self._abandoned_open(live, run)
                    return after
                await self._submit(live, run, conv, prompt)
        except c.SubmissionUncertain as exc:
            # The provider may be running it. Surface it; never resend. The turn stays active
            # until the provider reports its end or the user cancels it.
            err = wire.ErrorRecord(code=exc.code, message=exc.message)
            await self._append(live, "error", _json.encode(err), run=run)
            raise
        except BaseException as exc:
            message = exc.message if isinstance(exc, c.AgentdError) else f"{type(exc).__name__}: {exc}"
            if not self._holds(live):
                raise  # removed (or lost to another host) meanwhile: nothing of it is journaled any more
            if live.run != run:
                # The turn already ended and has its outcome. It is not ended a second time
                # (that would end whatever run came after it).
                if not opened and isinstance(exc, Exception):
                    # Its open failed after it was cancelled: nothing was sent, the cancel stands.
                    log.warning("turn.open_failed_after_end", conversation=live.record.id, run=run, error=message)
                    return after
            else:
                if isinstance(exc, c.Busy):
                    reason = "busy"
                else:
                    reason = "send_failed"
                with trio.CancelScope(shield=True):
                    turn = c.Turn(state=c.TurnState.FAILED, error=message, reason=reason)
                    await self._end_turn(live, turn, run)
            if isinstance(exc, (c.AgentdError, trio.Cancelled)) or not isinstance(exc, Exception):
                raise
            raise c.InternalError(message) from exc
        if live.run == run and _turnwatch.deadline(self)[0] > 0:
            live.last_event = trio.current_time()
            self._spawn(_turnwatch.watch, self, live, run)
        return after

    async def _submit(self, live: _Live, run: str, conv: c.Conversation, prompt: c.Prompt) -> None:
        """Hand ``run``'s prompt to ``conv`` (see agentd.slash_commands.submit); raises what it raises."""
        live.sink.tagger.begin(run)
        try:
            await _slash.submit(self, live, conv, prompt)
        except BaseException as exc:
            if not isinstance(exc, c.SubmissionUncertain):
                live.sink.tagger.open = False  # the provider refused it: no turn of its own runs
            raise

    async def _reopen_after_loss(self, live: _Live, conv: c.Conversation) -> c.Conversation:
        """``conv``'s runtime no longer has its session: close it, then open the conversation again.

        Raises what :meth:`_ensure_open` raises (NotFound when the runtime's context is lost).
        """
        async with live.open_lock:
            if live.conv is conv:
                live.conv = None
        with trio.CancelScope(shield=True), trio.move_on_after(INTERRUPT_WAIT_S):
            await conv.close()
        return await self._ensure_open(live)

    async def _abandoned_open(self, live: _Live, run: str) -> None:
        """``run`` ended while its provider conversation was being opened; its prompt is not sent.

        The conversation opened is kept for the next prompt, unless this
        conversation was closed or deleted meanwhile (whose close found
        nothing open yet): then it is closed here.
        """
        log.info("turn.ended_before_send", conversation=live.record.id, run=run)
        self.publish_held(live)  # a close below waits for the runtime
        if live.record.state is not _S.CLOSED and self._live.get(live.record.id) is live:
            return
        conv, live.conv = live.conv, None
        if conv is None:
            return
        with trio.move_on_after(INTERRUPT_WAIT_S):
            try:
                await conv.close()
            except Exception as exc:
                log.warning("conversation.close_failed", conversation=live.record.id, error=str(exc))

    async def steer(self, ref: str, text: str) -> wire.SendResult:
        live = await self.live(ref)
        if not (await self.runtimes.get(live.record.provider)).capabilities().steer:
            raise c.Unsupported(f"provider {live.record.provider} cannot steer a running turn")
        async with live.send_lock:
            if not live.run:
                raise c.Invalid("no turn is running; use send")
            await self._steer(live, text)
            return wire.SendResult(run=live.run, disposition="steered", after=live.published_seq)

    async def _steer(self, live: _Live, text: str, attachments: "list[c.Attachment] | None" = None) -> None:
        if live.conv is None:
            raise c.Closed("the provider conversation is not open")
        caps = (await self.runtimes.get(live.record.provider)).capabilities()
        if not caps.steer:
            raise c.Unsupported(f"provider {live.record.provider} cannot steer a running turn")
        prompt = wire.PromptRecord(text=text, disposition="steered", attachments=_journaled(attachments or []))
        await self._append(live, "prompt", _json.encode(prompt), run=live.run)
        await live.conv.steer(c.Prompt(text=text, attachments=list(attachments or [])))

    async def cancel(self, ref: str) -> wire.CancelResult:
        """Cancel the running turn (queued prompts still run after it).

        Returns once the turn ended, at most ``cancel_timeout_s`` later: a turn
        the runtime has not ended by then ends ``cancelled``, reason
        ``cancel_timeout`` (see agentd.turnwatch). Returns how it ended;
        no turn running: an empty result, nothing changed.
        """
        live = await self.live(ref)
        return await _turnwatch.cancel(self, live)

    async def _cancel(self, live: _Live) -> None:
        if not live.run:
            return
        if live.conv is None:
            # Nothing runs at the provider: the turn ends here. Its prompt is not sent after
            # all when its conversation was still being opened (see _start).
            if live.opening_run == live.run:
                error = "cancelled before the runtime was ready"
            else:
                error = "the runtime was gone"
            turn = c.Turn(state=c.TurnState.CANCELLED, reason="cancelled", error=error)
            await self._end_turn(live, turn, live.run)
            return
        await live.conv.cancel()

    async def set_title(self, ref: str, title: str) -> str:
        """Set the title (journaled), and name the conversation in the provider's store where it can.

        Returns the title as set: its whitespace folded to single spaces ("" clears it).
        A provider whose capabilities include ``titles`` is told, its
        conversation opened for it if needed; failing that is logged, the
        title stays set here. Raises Invalid for a title over 200 characters.
        """
        title = user_title(title)
        live = await self.live(ref)
        source = "user" if title else ""
        if (live.record.title, live.record.title_source) != (title, source):  # the same again journals nothing
            live.record.title = title
            live.record.title_source = source
            self._save(live.record)
            await self._append(live, "title", _json.encode(title), run=live.run)
        if live.record.state is _S.CLOSED:
            return title
        if self.site and live.record.site and live.record.site != self.site:
            return title  # its runtime's session is on its own site's disk: named there, not here
        try:
            if not (await self.runtimes.get(live.record.provider)).capabilities().titles:
                return title
            conv = live.conv if live.conv is not None else await self._ensure_open(live)
            await conv.set_title(title)
        except c.Unsupported:
            pass
        except c.AgentdError as exc:
            log.warning("conversation.provider_title_failed", conversation=live.record.id, error=exc.message)
        return title

    async def close(self, ref: str, *, reason: str = "") -> None:
        """Cancel the running turn, close the provider conversation, release the lease.

        ``reason`` goes on the ``state`` record (``budget`` when a budget stopped it). A closed
        conversation is left as it is: closing it again journals nothing.
        """
        if self.record(ref).state is _S.CLOSED:
            return
        live = await self.live(ref)
        # Queued prompts first, so the cancelled turn's end does not start one; each gets its outcome.
        queued, live.queue = list(live.queue), deque()
        live.record.queued = []
        for run, _text in queued:
            turn = c.Turn(state=c.TurnState.CANCELLED, reason="closed",
                          error="the conversation was closed before this queued prompt was sent")
            await self._append(live, "turn", _json.encode(turn), run=run)
        if live.run:
            await self._cancel(live)
            with trio.move_on_after(INTERRUPT_WAIT_S):
                await live.turn_done.wait()
        if live.conv is not None:
            await live.conv.close()
            live.conv = None
        live.record.state = _S.CLOSED
        self._save(live.record)
        await self._append(live, "state", _json.encode(wire.StateRecord(state=_S.CLOSED, reason=reason)))
        await self._append(live, "lease", _json.encode(wire.LeaseRecord(action="released", owner=self.owner)))
        await self.leases.release(live.record.id)

    async def delete(self, ref: str) -> None:
        """Close the conversation and delete its record and journal."""
        cid = self.resolve(ref)
        self.write_behind.discard(cid)
        live = self._live.pop(cid, None)
        # Gone before anything awaits: a subscriber dropped below re-subscribes to find it gone,
        # not still listed (it would then follow a conversation nobody ends).
        self._records.pop(cid, None)
        if live is not None:
            if live.run and live.conv is not None:
                with trio.move_on_after(INTERRUPT_WAIT_S):
                    await live.conv.cancel()
            if live.conv is not None:
                with trio.move_on_after(INTERRUPT_WAIT_S):
                    await live.conv.close()
            live.events.close()
        for sub in self.hub.drop_conversation(cid):
            sub.outbox.lagged(sub)
        try:
            await self.leases.release(cid)
        except Exception:
            log.exception("lease.release_failed", conversation=cid)
        await self.store.remove(cid)

    # ------------------------------------------------------------------ reads

    async def info(self, ref: str) -> wire.ConversationInfo:
        cid = self.resolve(ref)
        live = self._live.get(cid)
        record = self._records[cid]
        if live is None:
            await self.store.journal_size(cid)  # one lstat: a journal agentd refuses (a symlink) is said here too
            return wire.ConversationInfo(record=record, usage=record.usage)
        return wire.ConversationInfo(
            record=record,
            last_seq=live.published_seq,
            pending=list(live.pending.values()),
            queued=len(live.queue),
            usage=record.usage,
        )

    def snapshot(self, live: _Live | _Reader) -> wire.Snapshot:
        if isinstance(live, _Reader):
            loaded = self._live.get(live.record.id)
            if loaded is None:  # not loaded: no turn in flight here
                return wire.Snapshot(state=live.record.state, last_seq=live.published_seq, run=live.record.active_run)
            live = loaded
        return wire.Snapshot(
            state=live.record.state,
            last_seq=live.published_seq,
            run=live.run,
            items=[
                wire.InFlightItem(id=item_id, kind=kind, agent_id=agent_id, text="".join(chunks))
                for item_id, (kind, agent_id, chunks) in live.items.items()
            ],
            pending=list(live.pending.values()),
            todos=live.todos,
            activity=live.activity,
            context=live.context,
        )

    def loaded(self) -> Iterable[_Live]:
        return self._live.values()

    async def detach(self, live: _Live) -> bool:
        """Close ``live``'s provider conversation if no turn runs, so that its next prompt opens it
        again on the provider as configured then (agentd.reload); the record and journal stay.
        Returns whether it was closed (False: a turn runs, or none was open)."""
        async with live.open_lock:
            if live.run or live.conv is None:
                return False
            conv, live.conv = live.conv, None
        with trio.move_on_after(INTERRUPT_WAIT_S):
            await conv.close()
        return True

    def keepers(self, cid: str) -> frozenset[int]:
        """The pids of the keepers (agentd.procs) whose processes act for conversation ``cid`` (a full
        id) on this host now, as its provider reports them; empty when it is not loaded or no runtime
        runs it. Only those processes may call its host tools (agentd.agent_peers)."""
        live = self._live.get(cid)
        return live.sink.keepers() if live is not None else frozenset()

    # ------------------------------------------------------------------ other hosts (agentd.hosts)

    def is_loaded(self, cid: str) -> bool:
        """Whether this host holds the conversation open (it writes its journal and record)."""
        return cid in self._live

    def remote_record(self, cid: str, data: bytes | None) -> wire.ConversationRecord | None:
        """A record another host wrote (``data``, None: deleted there) replaces this host's copy,
        unless this host holds the conversation (then its own copy is the authority). Returns the
        record now kept, None when there is none."""
        if cid in self._live:
            return self._live[cid].record
        if data is None:
            if self._records.pop(cid, None) is not None:
                # Deleted on another host: its subscribers here end as a local delete ends them.
                for sub in self.hub.drop_conversation(cid):
                    sub.outbox.lagged(sub)
            return None
        try:
            record = _record_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.error("conversation.record_unreadable", conversation=cid, error=str(exc))
            return self._records.get(cid)
        kept = self._records.get(cid)
        if kept is None:
            self._records[cid] = record
            return record
        for name in record.__struct_fields__:  # in place: whoever holds the record sees the update
            setattr(kept, name, getattr(record, name))
        return kept

    async def catch_up(self, record: wire.ConversationRecord) -> None:
        """Bring a record older than its journal up to date (a turn's start is its prompt record)."""
        await self._catch_up(record)

    async def recover(self, cid: str) -> wire.ConversationRecord:
        """Load ``cid`` (taking its lease: LeaseHeld when a live host holds it) and end what a dead
        holder left running, ``run_interrupted``, as recovery at start does; the record after that."""
        async with self._recovering(cid):  # two callers (a lease takeover, a task's) must not both end the run
            live = await self._load(cid)
            if live.record.active_run or live.record.queued:
                await self._recover_one(live.record)
        return live.record

    async def forget(self, cid: str, record: bytes | None) -> None:
        """This host lost ``cid``'s lease (it stalled past the TTL and another host took the
        conversation over): drop the loaded conversation without journaling or saving anything more
        (the new holder writes it now), stop its runtime's turn, and keep ``record`` (the database's,
        None: deleted) as this host's copy. Its journal starts again at the last seq this host
        committed; the caller relays the rest to subscribers."""
        self.write_behind.discard(cid)
        live = self._live.pop(cid, None)
        if live is None:
            return
        live.lost = True
        self._forgotten[cid] = live.record
        log.warning("conversation.lost", conversation=cid, run=live.run)
        conv, live.conv = live.conv, None
        if conv is not None:
            with trio.move_on_after(INTERRUPT_WAIT_S) as scope:
                scope.shield = True
                try:
                    if live.run:
                        await conv.cancel()
                    await conv.close()
                except Exception as exc:
                    log.warning("conversation.lost_close_failed", conversation=cid, error=str(exc))
        live.events.close()
        live.turn_done.set()
        forget = getattr(self.store, "forget", None)
        if forget is not None:
            forget(cid)
        self._records.pop(cid, None)  # a fresh copy: the lost one's tasks may still hold the old
        self.remote_record(cid, record)

    async def unload(self, cid: str) -> bool:
        """Give a loaded, idle conversation back: its provider conversation closed, its record saved,
        ``lease released`` journaled and the lease released, so another host may open it. False (and
        nothing done) while a turn runs or prompts wait."""
        live = self._live.get(cid)
        if live is None:
            return True
        if live.run or live.record.active_run or live.record.queued:
            return False
        async with live.open_lock:
            conv, live.conv = live.conv, None
        if conv is not None:
            with trio.move_on_after(INTERRUPT_WAIT_S):
                await conv.close()
        await self._append(live, "lease", _json.encode(wire.LeaseRecord(action="released", owner=self.owner)))
        self._save(live.record)
        await live.journal.sync()
        self._live.pop(cid, None)
        live.events.close()
        await self.leases.release(cid)
        return True

    async def note(self, ref: str, type_: str, data: bytes) -> int:
        """Journal one record another service keeps about this conversation (``task`` events), then publish it.

        ``data`` is the encoded payload. Loads the conversation if needed;
        works on a closed one too. Returns its seq. Raises NotFound,
        InternalError (the journal cannot be written).
        """
        live = await self.live(ref)
        return await self._append(live, type_, data)

    # ------------------------------------------------------------------ attachments, titles, export

    async def _store_uploads(self, live: _Live, uploads: "list[wire.Upload]") -> list[c.Attachment]:
        """Check and store a prompt's files (in a worker thread); their Attachments carry ``path``."""
        cfg = self.attachments
        provider = live.record.provider
        if not (await self.runtimes.get(provider)).capabilities().attachments:
            raise c.Unsupported(f"provider {provider} takes no attachments")
        if len(uploads) > cfg.max_files:
            raise c.LimitExceeded(f"{len(uploads)} attachments; a prompt takes at most {cfg.max_files} "
                                  "([attachments] max_files)")
        directory = self.store.root / live.record.id

        def store_all() -> list[c.Attachment]:
            out = []
            for up in uploads:
                data = _attachments.decode(up.name, up.data, max_bytes=cfg.max_bytes)
                out.append(_attachments.store(directory, up.name, data, allowed_types=cfg.allowed_types))
            return out

        try:
            stored = await trio.to_thread.run_sync(store_all)
        except OSError as exc:
            log.error("attachments.write_failed", conversation=live.record.id, error=str(exc))
            raise c.InternalError(f"cannot store the attachment: {exc.strerror or exc}") from None
        log.info("attachments.stored", conversation=live.record.id,
                 files=[{"name": a.name, "mime": a.mime, "size": a.size} for a in stored])
        return stored

    async def _retention_loop(self) -> None:
        """Delete uploads older than ``[attachments] retention_days``: just after start-up, then daily."""
        days = self.attachments.retention_days
        if days <= 0:
            return
        # Not during start-up: the sweep visits every conversation's directory, and its worker
        # thread would hold the GIL while the daemon loads and gets ready.
        await trio.sleep(SWEEP_DELAY_S)
        while True:
            try:
                removed = await trio.to_thread.run_sync(_attachments.sweep, self.store.root, days)
                if removed:
                    log.info("attachments.swept", removed=removed, retention_days=days)
            except OSError as exc:
                log.error("attachments.sweep_failed", error=str(exc))
            await trio.sleep(86400)

    async def _title_from_prompt(self, live: _Live, text: str) -> None:
        """Title an untitled conversation from its first prompt (journaled; the provider is not told,
        so a title it makes up itself later still replaces this one)."""
        title = title_from_prompt(text)
        if not title:
            return
        live.record.title = title
        live.record.title_source = "prompt"
        self._save_quietly(live.record)
        await self._append(live, "title", _json.encode(title))

    async def export(self, ref: str, fmt: str, *, include_tools: bool = False, all_: bool = False) -> wire.ExportResult:
        """The transcript from the journal, rendered (:mod:`agentd.export`) in a worker thread.

        Reads the journal as published so far, in chunks; turns a rewind dropped are left out
        unless ``all_`` (agentd.branching.view). Raises Invalid for an unknown format, the
        journal's own errors for a damaged one.
        """
        from . import branching as _branching
        from . import export as _export

        if fmt not in _export.FORMATS:
            raise c.Invalid(f"unknown export format {fmt!r}; use one of: {', '.join(_export.FORMATS)}")
        live = await self.live(ref)
        record = msgspec.structs.replace(live.record)
        lines = _branching.view(await self.published_lines(live), record.dropped, all_)
        whole = functools.partial(self.tool_outputs.read_all, record.id) if include_tools else None
        text = await trio.to_thread.run_sync(
            lambda: _export.render(_export.transcript(record, lines, include_tools=include_tools,
                                                      whole_output=whole), fmt))
        return wire.ExportResult(conversation=record.id, format=fmt, text=text, title=record.title)

    async def published_lines(self, live: _Live | _Reader) -> list[bytes]:
        """The journal's lines as published so far, read in chunks."""
        from .store import read_published

        return await read_published(live.journal, live.published_seq)


def _journaled(attachments: "list[c.Attachment]") -> list[c.Attachment]:
    """Attachments as journaled: without the stored path."""
    return [msgspec.structs.replace(a, path="") if a.path else a for a in attachments]


def _unfinished_tools(items: "Iterable[c.Item]") -> list[c.Item]:
    """Tool items a crash cut short, ended as the providers end them: ``failed``, the reason
    (``run_interrupted``) appended to the output, no live tail."""
    now = c.utcnow()
    out = []
    for item in items:
        tool = item.tool
        if tool is None or tool.status not in (c.ToolStatus.RUNNING, c.ToolStatus.PENDING):
            continue
        why = c.RUN_INTERRUPTED
        tool = msgspec.structs.replace(tool, status=c.ToolStatus.FAILED, tail=[],
                                       output=f"{tool.output}\n{why}" if tool.output else why)
        out.append(msgspec.structs.replace(item, tool=tool, ended_at=now))
    return out
