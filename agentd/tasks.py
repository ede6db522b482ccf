"""Tasks: non-interactive jobs, queued per provider, each run in a conversation of its own.

A task is an input for a provider. The :class:`TaskService` queues it
(``pending``), starts it when its provider has a free place (at most
``tasks.concurrency`` running per provider, oldest first), runs it as the
first turn of a NEW interactive conversation (``running``), and ends with that
turn: ``completed``, ``failed`` or ``cancelled``, with the turn's last
assistant message as its result. Nobody answers for it: a pending interaction
makes it ``waiting_for_input`` until someone answers it on its conversation
(``agentctl answer``), then it goes on.

Rules kept here:

* The record (``<state_dir>/tasks/<id>.json``, replaced atomically) says
  ``running`` before the conversation is created and its prompt sent. A task
  found running (or waiting) at start-up is recorded ``failed`` with reason
  ``run_interrupted``, as its conversation records its turn; it is never run
  again. Pending tasks found at start-up run.
* Task events (created, started, status changes, comments, callback
  attempts) are journaled as ``task`` records in the task's conversation, once
  it has one.
* On its terminal status a task with a callback URL POSTs a JSON summary
  there, retried with exponential backoff until ``callback_retry_window_s``
  after it ended (across restarts), every attempt recorded. A callback that
  keeps failing never changes the task's status.

Knows nothing of sockets: the server maps its methods to ``task_*`` ops.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import os
import time
import unicodedata
import urllib.parse
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import __version__, _fsutil
from . import contract as c
from . import wire
from .hub import Hub, Subscription

if TYPE_CHECKING:
    from .config import TasksConfig
    from .conversations import ConversationService

log = structlog.get_logger("agentd.tasks")

_T = wire.TaskStatus
_json = msgspec.json.Encoder()
_task_decoder = msgspec.json.Decoder(wire.TaskRecord)
_item_decoder = msgspec.json.Decoder(c.Item)
_turn_decoder = msgspec.json.Decoder(c.Turn)
_interaction_decoder = msgspec.json.Decoder(c.Interaction)
_tokens_decoder = msgspec.json.Decoder(c.TokenUsage)

#: How long ``cancel`` waits for a running task's turn to end, seconds.
CANCEL_WAIT_S = 10.0
#: How long a comment on a running task whose turn is still starting (its runtime and
#: conversation being opened) waits for the turn before it is only recorded, seconds.
COMMENT_TURN_WAIT_S = 30.0
#: A comment holds at most this many characters, and a task at most MAX_COMMENTS of them: the
#: task list carries every task with its comments, so each task's share of it stays bounded.
MAX_COMMENT_CHARS = 16_384
MAX_COMMENTS = 256
#: Characters of a task's input, result and each comment that the task list carries (then "…").
LIST_TEXT_CHARS = 1000
#: A page of the task list holds at most this many bytes of tasks (and one task at least).
LIST_PAGE_BYTES = 16 << 20
#: Error of a task found running when the daemon starts.
INTERRUPTED_ERROR = "agentd stopped while this task was running; its prompt was not resent"
#: Turn states -> the task status they end it with.
_END = {c.TurnState.COMPLETED: _T.COMPLETED, c.TurnState.CANCELLED: _T.CANCELLED, c.TurnState.FAILED: _T.FAILED}


def _now() -> str:
    """Now, UTC, RFC 3339 with milliseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _epoch(ts: str) -> float:
    """An RFC 3339 time from :func:`_now` as unix seconds (now when it cannot be read)."""
    try:
        return _dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _new_id() -> str:
    from .conversations import new_id

    return new_id("t")


def check_callback(url: str) -> None:
    """Raise Invalid unless ``url`` is an absolute http or https URL with a host, a port in
    1-65535 when it names one, and no whitespace or control character (which no request line
    may carry: each attempt would fail, retried for the whole retry window)."""
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in url):
        raise c.Invalid(f"callback {url!r} holds whitespace or a control character; percent-encode it")
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise c.Invalid(f"callback {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise c.Invalid(f"callback {url!r} is not an http(s) URL (http://host/... or https://host/...)")
    if port == 0:
        raise c.Invalid(f"callback {url!r} names port 0, where nothing can listen")


# --------------------------------------------------------------------------- store


class TaskStore:
    """Task records, one ``<id>.json`` each under ``root`` (mode 0700), replaced atomically.

    Synchronous and blocking (one small file per call), like the conversation
    records; used from the trio thread only.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(self, task: wire.TaskRecord) -> None:
        """Write ``task`` (write, fsync, rename, fsync dir). Raises OSError."""
        _fsutil.make_dirs(self.root)
        _fsutil.atomic_write(self.root / f"{task.id}.json", _json.encode(task))

    def load(self) -> list[wire.TaskRecord]:
        """Every readable record, oldest first; an unreadable one is logged and skipped."""
        out = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for e in entries:
            stem = e.name[:-5] if e.name.endswith(".json") else ""
            if not stem or not _fsutil.is_safe_name(stem):
                continue  # temp files of an interrupted write start with a dot
            try:
                out.append(_task_decoder.decode(_fsutil.read_file(Path(e.path))))
            except (OSError, msgspec.DecodeError) as exc:
                log.error("task.record_unreadable", path=e.path, error=str(exc))
        out.sort(key=lambda t: (t.created_at, t.id))
        return out


# --------------------------------------------------------------------------- following a turn


class _Tracker:
    """What one run's records say: its last assistant message, usage, pending interactions, end."""

    def __init__(self, run: str) -> None:
        self.run = run
        #: assistant messages of the main agent, by item id, in the order they first appeared
        self.items: dict[str, str] = {}
        self.pending: set[str] = set()
        self.turn: c.Turn | None = None
        self.input = self.output = self.cached = 0
        self.call_cost: float | None = None
        self.cost_usd: float | None = None
        self.ai_units = 0.0
        #: the daemon's token totals from ``usage`` records, when it keeps them
        self.totals = (0, 0, 0)
        self.estimated = False
        self.reported = False

    def feed(self, rec: wire.Record) -> None:
        kind = rec.type
        if kind == "usage":
            # The conversation's totals; a task's conversation holds the task's turn.
            usage = msgspec.json.decode(rec.data)
            if isinstance(usage, dict):
                self.reported = True
                self.ai_units = float(usage.get("ai_units") or 0.0)
                if usage.get("cost_usd") is not None:
                    self.cost_usd = float(usage["cost_usd"])
                self.totals = tuple(int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens", "cached_tokens"))  # type: ignore[assignment]
                self.estimated = bool(usage.get("estimated"))
            return
        if not self.run or rec.run != self.run:
            return
        if kind == "item":
            item = _item_decoder.decode(rec.data)
            if item.kind is c.ItemKind.ASSISTANT and not item.agent_id:
                self.items[item.id] = item.text
        elif kind == "tokens":
            tokens = _tokens_decoder.decode(rec.data)
            self.reported = True
            self.input += tokens.input
            self.output += tokens.output
            self.cached += tokens.cache_read
            if tokens.cost_usd is not None:
                self.call_cost = (self.call_cost or 0.0) + tokens.cost_usd
        elif kind == "interaction":
            inter = _interaction_decoder.decode(rec.data)
            if inter.state is c.InteractionState.PENDING:
                self.pending.add(inter.id)
            else:
                self.pending.discard(inter.id)
        elif kind == "turn":
            turn = _turn_decoder.decode(rec.data)
            if turn.state.terminal:
                self.turn = turn
                self.pending.clear()

    @property
    def result(self) -> str:
        texts = [t for t in self.items.values() if t]
        return texts[-1] if texts else ""

    def usage(self) -> wire.TaskUsage | None:
        if not self.reported:
            return None
        tokens = self.totals if any(self.totals) else (self.input, self.output, self.cached)
        return wire.TaskUsage(
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            cached_tokens=tokens[2],
            cost_usd=self.cost_usd if self.cost_usd is not None else self.call_cost,
            ai_units=self.ai_units,
            estimated=self.estimated and self.cost_usd is not None,
        )


class _Watch:
    """A hub outbox holding one conversation's published records for its task's runner.

    Unbounded on purpose, like the providers' sink: ``offer`` never refuses, so
    the hub never cuts the runner off, and the runner drains it as fast as
    the conversation service publishes. ``lagged`` only comes when the
    conversation is removed.
    """

    def __init__(self) -> None:
        self.frames: deque[bytes] = deque()
        self.gone = False
        self._wake: trio.Event | None = None

    def offer(self, frame: bytes) -> bool:
        self.frames.append(frame)
        self._set()
        return True

    def offer_many(self, frames: bytes, count: int) -> bool:
        """``count`` frames joined, each ending with a newline (frames hold none inside)."""
        self.frames.extend(f for f in frames.split(b"\n") if f)
        self._set()
        return True

    def lagged(self, subscription: Subscription) -> None:
        self.gone = True
        self._set()

    def _set(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def next(self) -> wire.Record | None:
        """The next durable record (live-only ones are skipped); None once the conversation is gone."""
        while True:
            while not self.frames:
                if self.gone:
                    return None
                self._wake = trio.Event()
                await self._wake.wait()
            frame = wire.decode_server_frame(self.frames.popleft().rstrip(b"\n"))
            if isinstance(frame, wire.EventFrame):
                rec = wire.decode_record(frame.record)
                if rec.seq:
                    return rec


class _Active:
    """The in-memory side of a task that holds a place: cancel requests, and its end."""

    def __init__(self) -> None:
        self.cancel_requested = False
        self.done = trio.Event()
        #: Set once the task's turn was submitted (or the task ended without one).
        self.turn_sent = trio.Event()


# --------------------------------------------------------------------------- the service


class TaskService:
    """Every task of this daemon; see the module docstring for the rules.

    Methods raise the contract's errors (NotFound, Invalid, InternalError),
    which the server maps to wire error codes. Run :meth:`run` in a nursery
    after the conversation service is running.
    """

    def __init__(self, conversations: "ConversationService", hub: Hub, config: "TasksConfig", root: Path,
                 *, shared: Any = None) -> None:
        self.conversations = conversations
        self.hub = hub
        self.config = config
        #: on a store shared by several hosts, agentd.hosts.tasks.SharedTasks: records in the
        #: database, queued tasks claimed by any host offering their provider
        self.shared = shared
        self.store: Any = shared if shared is not None else TaskStore(root)
        self._tasks: dict[str, wire.TaskRecord] = {}
        #: pending task ids per provider, oldest first
        self._queues: dict[str, deque[str]] = {}
        #: tasks holding a place, per provider
        self._running: dict[str, int] = {}
        self._active: dict[str, _Active] = {}
        self._nursery: trio.Nursery | None = None
        #: comments being steered now, per task: they count against MAX_COMMENTS before they are kept
        self._commenting: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Load the records, settle what a previous daemon left, start pending tasks; serve until cancelled.

        Tasks found running are recorded failed (run_interrupted) and their
        callbacks sent; callbacks still being retried resume. On
        cancellation, running tasks stay ``running`` on disk (the next start
        records them interrupted) and callbacks in flight resume then.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for task in self.store.load():
                self._tasks[task.id] = task
            for task in list(self._tasks.values()):
                try:
                    await self._recover(task)
                except Exception:
                    log.exception("task.recovery_failed", task=task.id)
            if self.shared is not None:
                await nursery.start(self.shared.run, self)
            task_status.started()
            for provider in list(self._queues):
                self._dispatch(provider)
            await trio.sleep_forever()

    async def _recover(self, task: wire.TaskRecord) -> None:
        if task.status is _T.PENDING:
            self._queues.setdefault(task.provider, deque()).append(task.id)
        elif task.status in (_T.RUNNING, _T.WAITING_FOR_INPUT):
            tracker = await self._replay(task)
            turn = tracker.turn if tracker is not None else None
            if turn is not None and turn.reason != c.RUN_INTERRUPTED:
                # The turn ended before the daemon stopped; only the task's record missed it.
                await self._finish_with(task, turn, tracker)
            else:
                log.warning("task.interrupted", task=task.id, conversation=task.conversation, run=task.run)
                await self._finish(task, _T.FAILED, tracker, error=INTERRUPTED_ERROR, reason=c.RUN_INTERRUPTED)
        elif task.status.terminal and task.callback_state == "pending":
            self._spawn(self._deliver, task)

    async def _replay(self, task: wire.TaskRecord) -> _Tracker | None:
        """A tracker fed the task's conversation journal, or None when it has none (or it is unreadable)."""
        if not task.conversation:
            return None
        from .store import scan

        tracker: _Tracker | None = _Tracker(task.run) if task.run else None
        early: list[wire.Record] = []  # before the first prompt names the run, when the task does not
        try:
            live = await self.conversations.live(task.conversation)
            async for lines in scan(live.journal):  # a chunk at a time: the journal may be large
                for line in lines:
                    rec = wire.decode_record(line)
                    if tracker is None:
                        if rec.type != "prompt":
                            early.append(rec)
                            continue
                        tracker = _Tracker(rec.run)
                        for before in early:
                            tracker.feed(before)
                    tracker.feed(rec)
        except c.AgentdError as exc:
            log.error("task.journal_unreadable", task=task.id, conversation=task.conversation, error=exc.message)
            return None
        if tracker is None:
            tracker = _Tracker("")
            for rec in early:
                tracker.feed(rec)
        return tracker

    # ------------------------------------------------------------------ records

    def resolve(self, ref: str) -> wire.TaskRecord:
        """The task ``ref`` names: an exact id or a unique prefix. Raises NotFound, Invalid (ambiguous)."""
        task = self._tasks.get(ref)
        if task is not None:
            return task
        matches = [tid for tid in self._tasks if tid.startswith(ref)] if ref else []
        if not matches:
            raise c.NotFound(f"no task {ref!r}")
        if len(matches) > 1:
            raise c.Invalid(f"{ref!r} is ambiguous: {', '.join(sorted(matches)[:5])}")
        return self._tasks[matches[0]]

    def _save(self, task: wire.TaskRecord) -> None:
        """Write the record; a write error is logged (the task goes on in memory)."""
        task.updated_at = _now()
        try:
            self.store.save(task)
        except OSError as exc:
            log.error("task.record_write_failed", task=task.id, error=str(exc))

    async def _event(self, task: wire.TaskRecord, event: str, **fields: Any) -> None:
        """Journal a ``task`` record in the task's conversation, if it has one; errors are logged."""
        if not task.conversation:
            return
        data = _json.encode(wire.TaskEvent(task=task.id, event=event, **fields))  # type: ignore[arg-type]
        try:
            await self.conversations.note(task.conversation, "task", data)
        except c.AgentdError as exc:
            log.warning("task.journal_failed", task=task.id, conversation=task.conversation, error=exc.message)

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None, "TaskService.run() is not running"
        self._nursery.start_soon(fn, *args)

    def _limit(self, provider: str) -> int:
        return self.config.provider_concurrency.get(provider, self.config.concurrency)

    # ------------------------------------------------------------------ requests

    async def create(
        self, *, provider: str, workdir: str, input: str, model: str = "", callback: str = "",
        mode: str = "interactive", budget: wire.Budget | None = None,
    ) -> wire.TaskRecord:
        """Queue a task; returns its record (``pending``) once it is on disk.

        ``provider`` "" is the config's ``[providers] default``. ``mode``
        yolo has its permission requests answered allow-once; ``budget`` is its
        conversation's (None: the provider's default). Raises Invalid (empty
        input, a workdir that is not an existing absolute directory, a callback
        that is not an http(s) URL, no provider, a model the provider does not list),
        NotFound (unknown provider),
        RuntimeUnavailable (the provider cannot run a turn now: the message
        says how to fix it; nothing is queued), InternalError (the record
        cannot be written).
        """
        if not input.strip():
            raise c.Invalid("the task input is empty")
        runtimes = self.conversations.runtimes
        provider = runtimes.pick(provider)
        names = runtimes.names()
        if provider not in names:
            raise c.NotFound(f"no provider {provider!r}; configured: {', '.join(names) or 'none'}")
        if not os.path.isabs(workdir) or not os.path.isdir(workdir):
            raise c.Invalid(f"workdir {workdir!r} is not an existing absolute directory")
        if callback:
            check_callback(callback)
        # Refused now, not failed later when nobody watches: a task is unattended.
        await runtimes.can_run(provider)
        if model:  # as `new` checks it: an unknown model (a missing script) is refused, not queued
            from . import models

            await models.check_choice(runtimes, provider, model, "", workdir=workdir)
        now = _now()
        task = wire.TaskRecord(
            id=_new_id(), provider=provider, workdir=workdir, input=input, created_at=now, updated_at=now,
            model=model, callback=callback, mode=mode, budget=budget,  # type: ignore[arg-type]
        )
        try:
            self.store.save(task)
        except OSError as exc:
            raise c.InternalError(f"cannot write the task record: {exc.strerror or exc}") from None
        if self.shared is not None:
            await self.shared.durable()  # queued for every host once it is in the database
        self._tasks[task.id] = task
        if self.shared is None:
            self._queues.setdefault(provider, deque()).append(task.id)
        log.info("task.created", task=task.id, provider=provider, callback=bool(callback))
        self._dispatch(provider)
        return task

    def list(self, statuses: list[wire.TaskStatus] | None = None, *, after: str = "",
             limit: int = 1000) -> tuple[list[wire.TaskRecord], str]:
        """A page of the tasks (of ``statuses``, if given), oldest first, after the task ``after``
        (an id; "" = from the first): at most ``limit`` and LIST_PAGE_BYTES of them (one at
        least), each with its input, result and comments cut to LIST_TEXT_CHARS. Returns the page
        and the ``after`` of the next ("" = none): a list of every task could pass the frame a
        client reads, as tasks are never removed. ``info`` gives a task whole. Raises NotFound
        for an unknown ``after``."""
        tasks = sorted(self._tasks.values(), key=_order)
        if after:
            cursor = self._tasks.get(after)
            if cursor is None:
                raise c.NotFound(f"no task {after!r} to page after")
            tasks = tasks[bisect.bisect_right(tasks, _order(cursor), key=_order):]
        page: list[wire.TaskRecord] = []
        size = 0
        for task in tasks:
            if statuses and task.status not in statuses:
                continue
            if len(page) >= limit:
                return page, page[-1].id
            listed = _listed(task)
            size += len(_json.encode(listed))
            if size > LIST_PAGE_BYTES and page:
                return page, page[-1].id
            page.append(listed)
        return page, ""

    async def info(self, ref: str) -> wire.TaskInfo:
        """The record and, while its turn runs, the interactions it waits for."""
        task = self.resolve(ref)
        pending: list[c.Interaction] = []
        if task.conversation and task.status in (_T.RUNNING, _T.WAITING_FOR_INPUT):
            try:
                pending = (await self.conversations.info(task.conversation)).pending
            except c.NotFound:
                pass
        return wire.TaskInfo(task=task, pending=pending)

    async def cancel(self, ref: str) -> wire.TaskCancelResult:
        """Cancel a task: a pending one never runs; a running one has its turn cancelled.

        For a running task, waits up to CANCEL_WAIT_S for its turn to end.
        Raises NotFound, Invalid (the task already ended).
        """
        task = self.resolve(ref)
        if task.status.terminal:
            raise c.Invalid(f"task {task.id} already ended: {task.status.value}")
        active = self._active.get(task.id)
        if self.shared is not None and active is None:
            if task.status is _T.PENDING and await self.shared.cancel_queued(task):
                await self._finish(task, _T.CANCELLED, error="cancelled before it started", reason="cancelled")
                return wire.TaskCancelResult(task=task, disposition="dequeued")
            raise c.Busy(f"task {task.id} was claimed by another agentd host and runs there: cancel it on that "
                         f"host, or cancel its turn from here (agentctl cancel {task.conversation or 'CONVERSATION'})",
                         details={"task": task.id, "conversation": task.conversation})
        if task.status is _T.PENDING:
            queue = self._queues.get(task.provider)
            if queue is not None and task.id in queue:
                queue.remove(task.id)
            await self._finish(task, _T.CANCELLED, error="cancelled before it started", reason="cancelled")
            return wire.TaskCancelResult(task=task, disposition="dequeued")
        if active is None:  # pragma: no cover - a running task always holds a place
            raise c.InternalError(f"task {task.id} is {task.status.value} but not running here")
        active.cancel_requested = True
        if task.run:
            await self._cancel_turn(task)
        with trio.move_on_after(CANCEL_WAIT_S):
            await active.done.wait()
        if not task.status.terminal:
            disposition = "cancelling"
        else:
            disposition = "cancelled" if task.status is _T.CANCELLED else "ended"
        return wire.TaskCancelResult(task=task, disposition=disposition)  # type: ignore[arg-type]

    async def comment(self, ref: str, text: str) -> wire.TaskCommentResult:
        """Add a comment to a task; while its turn runs and the provider can steer, also steer the turn.

        The result's ``delivery`` says which (``steered`` or ``recorded``, with
        a note why). A task that holds a place but whose turn is still starting
        has the comment wait for that turn, up to COMMENT_TURN_WAIT_S. Raises
        NotFound, Invalid (empty text), LimitExceeded (over MAX_COMMENT_CHARS,
        or the task has MAX_COMMENTS already).
        """
        if not text.strip():
            raise c.Invalid("the comment is empty")
        if len(text) > MAX_COMMENT_CHARS:
            raise c.LimitExceeded(f"the comment is {len(text):,} characters; a comment takes at most "
                                  f"{MAX_COMMENT_CHARS:,} (send a long text to the conversation instead)")
        task = self.resolve(ref)
        if len(task.comments) + self._commenting.get(task.id, 0) >= MAX_COMMENTS:
            raise c.LimitExceeded(f"task {task.id} has {MAX_COMMENTS} comments, as many as a task takes")
        delivery, note = "recorded", ""
        self._commenting[task.id] = self._commenting.get(task.id, 0) + 1  # its place, held over any await
        try:
            active = self._active.get(task.id)
            if task.status in (_T.PENDING, _T.RUNNING) and not task.run and active is not None:
                # Claimed here, its turn still starting (runtime, conversation): the comment is for that turn.
                with trio.move_on_after(COMMENT_TURN_WAIT_S):
                    await active.turn_sent.wait()
            if task.status not in (_T.RUNNING, _T.WAITING_FOR_INPUT):
                note = f"the task is {task.status.value}; there is no turn to steer"
            elif not task.run or not self._turn_running(task):
                note = "the task's turn is not running"
            else:
                try:
                    await self.conversations.steer(task.conversation, text)
                    delivery = "steered"
                except c.AgentdError as exc:
                    note = exc.message
        finally:
            left = self._commenting.pop(task.id) - 1
            if left:
                self._commenting[task.id] = left
        comment = wire.TaskComment(
            id=f"{task.id}.{len(task.comments) + 1}", text=text, created_at=_now(), delivery=delivery, note=note  # type: ignore[arg-type]
        )
        task.comments.append(comment)
        self._save(task)
        await self._event(task, "comment", status=task.status, comment=comment)
        return wire.TaskCommentResult(task=task.id, comment=comment)

    def _turn_running(self, task: wire.TaskRecord) -> bool:
        try:
            return self.conversations.record(task.conversation).active_run == task.run
        except c.AgentdError:
            return False

    # ------------------------------------------------------------------ running

    def _dispatch(self, provider: str) -> None:
        """Start the provider's oldest pending tasks while it has free places (synchronous).
        On a shared store: look for queued tasks to claim (agentd.hosts.tasks)."""
        if self.shared is not None:
            self.shared.wake()
            return
        queue = self._queues.get(provider)
        while queue and self.free_places(provider) > 0:
            task = self._tasks.get(queue.popleft())
            if task is None or task.status is not _T.PENDING:
                continue
            self.start_claimed(task)

    def free_places(self, provider: str) -> int:
        """How many more of the provider's tasks may run now (``[tasks] concurrency``)."""
        return self._limit(provider) - self._running.get(provider, 0)

    def start_claimed(self, task: wire.TaskRecord) -> None:
        """Run ``task`` (``pending``, this host's to run) in a place of its provider."""
        self._tasks[task.id] = task
        self._running[task.provider] = self._running.get(task.provider, 0) + 1
        self._active[task.id] = _Active()
        self._spawn(self._run, task)

    async def adopt_interrupted(self, task: wire.TaskRecord) -> None:
        """A task a dead host was running, now this host's to end: ``run_interrupted`` (never run again)."""
        self._tasks[task.id] = task
        await self._recover(task)

    def remote_task(self, task: wire.TaskRecord) -> None:
        """A task record as the database has it; one running here keeps this host's copy."""
        if task.id not in self._active:
            self._tasks[task.id] = task

    async def refresh(self) -> None:
        """On a shared store: every host's tasks, as the database has them, before a listing or a lookup."""
        if self.shared is not None:
            await self.shared.refresh()

    async def _run(self, task: wire.TaskRecord) -> None:
        active = self._active[task.id]
        try:
            await self._execute(task, active)
        except Exception as exc:
            log.exception("task.run_failed", task=task.id)
            if not task.status.terminal:
                try:
                    await self._finish(task, _T.FAILED, error=f"internal error: {exc}", reason="internal")
                except Exception:
                    log.exception("task.finish_failed", task=task.id)
        finally:
            self._running[task.provider] -= 1
            self._active.pop(task.id, None)
            active.turn_sent.set()
            active.done.set()
            if task.status.terminal:  # not when the daemon stops: the task stays running on disk
                self._dispatch(task.provider)

    async def _execute(self, task: wire.TaskRecord, active: _Active) -> None:
        # Started in a nursery that may be stopping: never mark the task running then.
        await trio.lowlevel.checkpoint_if_cancelled()
        if task.status is not _T.PENDING:
            return  # cancelled between its dispatch and now
        task.status = _T.RUNNING
        task.started_at = _now()
        self._save(task)
        if self.shared is not None:
            await self.shared.durable()  # running before its prompt is sent: never run twice
        log.info("task.started", task=task.id, provider=task.provider)
        try:
            conv = await self.conversations.create(
                provider=task.provider, workdir=task.workdir, title=f"task {task.id}", model=task.model,
                mode=task.mode, budget=task.budget,
            )
        except c.AgentdError as exc:
            await self._finish(task, _T.FAILED, error=exc.message, reason="create_failed")
            return
        task.conversation = conv.id
        self._save(task)
        await self._event(task, "created", status=_T.PENDING)
        await self._event(task, "started", status=_T.RUNNING)
        if active.cancel_requested:
            await self._finish(task, _T.CANCELLED, error="cancelled before its prompt was sent", reason="cancelled")
            return
        # Watch the conversation from before the prompt: no record of the turn can be missed.
        live = await self.conversations.live(conv.id)
        watch = _Watch()
        sub = Subscription(0, conv.id, watch, after=live.published_seq)
        sub.live = True
        self.hub.add(sub)
        try:
            try:
                run = (await self.conversations.send(conv.id, task.input)).run
            except c.SubmissionUncertain as exc:
                # The provider may be running it: follow the turn, never resend.
                run = self.conversations.record(conv.id).active_run
                log.warning("task.submission_uncertain", task=task.id, error=exc.message)
                if not run:
                    await self._finish(task, _T.FAILED, error=exc.message, reason="uncertain")
                    return
            except c.AgentdError as exc:
                await self._finish(task, _T.FAILED, error=exc.message, reason="send_failed")
                return
            task.run = run
            self._save(task)
            active.turn_sent.set()
            if active.cancel_requested:
                await self._cancel_turn(task)
            await self._follow(task, _Tracker(run), watch)
        finally:
            self.hub.remove(sub)

    async def _follow(self, task: wire.TaskRecord, tracker: _Tracker, watch: _Watch) -> None:
        """Track the turn's records until it ends; keep the status in step with its pending interactions."""
        while True:
            rec = await watch.next()
            if rec is None:
                await self._finish(task, _T.FAILED, tracker, error="its conversation was removed",
                                   reason="conversation_removed")
                return
            tracker.feed(rec)
            turn = tracker.turn
            if turn is not None:
                await self._finish_with(task, turn, tracker)
                return
            status = _T.WAITING_FOR_INPUT if tracker.pending else _T.RUNNING
            if status is not task.status:
                task.status = status
                self._save(task)
                log.info("task.status", task=task.id, status=status.value)
                await self._event(task, "status", status=status)

    async def _finish_with(self, task: wire.TaskRecord, turn: c.Turn, tracker: _Tracker) -> None:
        """End ``task`` as its turn ended. An rm cancels the turn before the conversation goes:
        that end is the removal's (failed, ``conversation_removed``), as docs/tasks.md says; a
        cancelled turn that names no reason (a close, say) ends the task with reason ``cancelled``."""
        try:
            self.conversations.record(task.conversation)
        except c.NotFound:
            await self._finish(task, _T.FAILED, tracker, error="its conversation was removed",
                               reason="conversation_removed")
            return
        reason = turn.reason or ("cancelled" if turn.state is c.TurnState.CANCELLED else "")
        await self._finish(task, _END[turn.state], tracker, error=turn.error, reason=reason)

    async def _cancel_turn(self, task: wire.TaskRecord) -> None:
        try:
            await self.conversations.cancel(task.conversation)
        except c.AgentdError as exc:
            log.warning("task.cancel_failed", task=task.id, error=exc.message)

    async def _finish(
        self, task: wire.TaskRecord, status: wire.TaskStatus, tracker: _Tracker | None = None, *,
        error: str = "", reason: str = "",
    ) -> None:
        """Record the terminal status (on disk, then journaled), then start the callback."""
        task.status = status
        task.ended_at = _now()
        if tracker is not None:
            task.result = tracker.result
            task.usage = tracker.usage()
        task.error = error if status is not _T.COMPLETED else ""
        task.reason = reason
        if task.callback:
            task.callback_state = "pending"
        self._save(task)
        log.info("task.ended", task=task.id, status=status.value, reason=reason)
        await self._event(task, "status", status=status, reason=reason, error=task.error)
        if task.callback:
            self._spawn(self._deliver, task)

    # ------------------------------------------------------------------ callbacks

    async def _deliver(self, task: wire.TaskRecord) -> None:
        """POST the task's summary to its callback until a 2xx answer or the retry window closes.

        Each attempt is recorded on the task and journaled. The delay between
        attempts starts at ``callback_backoff_initial_s`` and doubles up to
        ``callback_backoff_max_s``; the window counts from the task's end, so
        a restart resumes where it left off. Never raises for a failed POST.
        """
        # Imported only when a callback is due, and in a worker thread: the import takes a
        # noticeable fraction of a second the loop must not stall for.
        import importlib

        httpx = await trio.to_thread.run_sync(importlib.import_module, "httpx")

        cfg = self.config
        body = _json.encode(
            wire.TaskCallback(
                task=task.id, status=task.status, result=task.result, conversation=task.conversation,
                usage=task.usage, error=task.error, reason=task.reason, created_at=task.created_at,
                ended_at=task.ended_at,
            )
        )
        headers = {
            "content-type": "application/json",
            "user-agent": f"agentd/{__version__}",
            "x-agentd-task": task.id,
            # Retries repeat it: a receiver that got the POST but whose answer was lost can tell.
            "idempotency-key": f"{task.id}.{task.status.value}",
        }
        deadline = _epoch(task.ended_at) + cfg.callback_retry_window_s
        delay = cfg.callback_backoff_initial_s
        for _ in task.callback_attempts:
            delay = min(delay * 2, cfg.callback_backoff_max_s)
        async with httpx.AsyncClient(timeout=cfg.callback_timeout_s, follow_redirects=False) as client:
            while task.callback_state == "pending":
                at = _now()
                code, error = 0, ""
                # httpx's timeout is per read: a receiver trickling a byte a second would hold the
                # attempt forever. callback_timeout_s bounds the whole attempt (connect, send, answer).
                with trio.move_on_after(cfg.callback_timeout_s) as attempt_scope:
                    try:
                        async with client.stream("POST", task.callback, content=body, headers=headers) as resp:
                            code = resp.status_code
                            seen = 0
                            async for chunk in resp.aiter_raw():  # the answer, within the deadline
                                seen += len(chunk)
                                if seen > 65536:  # nobody reads a callback's answer: no need of more
                                    break
                        if not 200 <= code < 300:
                            error = f"HTTP {code} {resp.reason_phrase}".rstrip()
                    except Exception as exc:  # any failure of the POST is an attempt that failed
                        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
                if attempt_scope.cancelled_caught:
                    code = 0
                    error = (f"timed out: no whole answer within {cfg.callback_timeout_s:g} s "
                             "(tasks.callback_timeout_s bounds connect, send and answer together)")
                attempt = wire.CallbackAttempt(
                    attempt=len(task.callback_attempts) + 1, at=at, status=task.status, status_code=code,
                    error=error, ok=not error,
                )
                task.callback_attempts.append(attempt)
                if attempt.ok:
                    task.callback_state = "delivered"
                elif time.time() + delay > deadline:
                    task.callback_state = "failed"
                self._save(task)
                log.info("task.callback", task=task.id, attempt=attempt.attempt, status_code=code, error=error,
                         state=task.callback_state)
                await self._event(task, "callback", status=task.status, attempt=attempt)
                if task.callback_state != "pending":
                    return
                await trio.sleep(delay)
                delay = min(delay * 2, cfg.callback_backoff_max_s)


def _cut(text: str) -> str:
    return text if len(text) <= LIST_TEXT_CHARS else text[:LIST_TEXT_CHARS] + "…"


def _order(task: wire.TaskRecord) -> tuple[str, str]:
    return task.created_at, task.id


def _listed(task: wire.TaskRecord) -> wire.TaskRecord:
    """``task`` as the task list carries it (see TaskService.list); the record itself when nothing is cut."""
    if len(task.input) <= LIST_TEXT_CHARS and len(task.result) <= LIST_TEXT_CHARS \
            and all(len(c.text) <= LIST_TEXT_CHARS for c in task.comments):
        return task
    comments = [msgspec.structs.replace(c, text=_cut(c.text)) if len(c.text) > LIST_TEXT_CHARS else c
                for c in task.comments]
    return msgspec.structs.replace(task, input=_cut(task.input), result=_cut(task.result), comments=comments)
