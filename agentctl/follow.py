"""Following a conversation: render (or print as JSON lines) what it streams,
answer its interactions when a person is at the terminal, and tell when the
followed turn ended.

Used by ``send --follow``, ``run``, ``tail`` and ``attach``. Interactions are
acted on only once the subscription caught up (its snapshot arrived) and the
stream went quiet for a moment, so an interaction answered later in the same
replay, or at once by yolo mode, is never asked again.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

import msgspec

from agentd import wire
from agentd.contract import (
    AgentdError,
    AnswerRecord,
    Interaction,
    InteractionGone,
    InteractionKind,
    InteractionState,
    Invalid,
    Item,
    NotFound,
    Turn,
)

from . import exitcodes
from .client import Client, Subscription
from .render import Renderer, full, json_record, json_snapshot, visible

#: How long the stream must be quiet before a pending interaction is acted on, seconds.
QUIET_S = 0.2
#: subscribe after this to get only what comes next: agentd takes the smaller of it and its last seq
FROM_NOW = 1 << 62
#: How long to wait for a record while looking back at the start of the turn in flight, seconds.
LOOK_BACK_TIMEOUT_S = 10.0
#: How often the live view (a spinner, a running tool's output) is redrawn on a terminal, seconds.
TICK_S = 0.1


class FollowResult(msgspec.Struct, kw_only=True):
    """The last line of ``--json`` output of a followed turn."""

    type: str = "result"
    conversation: str
    run: str
    state: str
    exit_code: int
    error: str = ""
    reason: str = ""
    #: agentd ended the turn itself (an inactivity deadline, an unconfirmed cancel, a lost end event)
    inferred: bool = False
    interaction: Interaction | None = None


class Follower:
    """Follows one conversation (or every one) over ``client``.

    ``renderer_for(conversation)`` gives the renderer of a conversation
    (human output); None with ``json_out`` set prints JSON lines instead.
    ``interactive`` answers interactions at the terminal (stdin must be a
    tty); ``exit_on_action`` stops with exit code 4 on an interaction nobody
    here may answer; ``yolo`` leaves permission requests to the daemon. ``notifier``
    (agentctl.liveview.Notifier) is told when an interaction waits for a
    person; ``live`` redraws the renderers' live region every :data:`TICK_S`.
    """

    def __init__(
        self,
        client: Client,
        *,
        renderer_for: Callable[[str], Renderer] | None,
        json_out: TextIO | None = None,
        interactive: bool = False,
        exit_on_action: bool = False,
        yolo: bool = False,
        notifier: Any = None,
        live: bool = False,
    ) -> None:
        self.client = client
        self.notifier = notifier
        self.live = live
        #: every renderer used, so a message to stderr first ends their open lines
        self._renderers: list[Renderer] = []
        #: replay the turns a rewind dropped too (tail/attach --all)
        self.dropped = False
        self._renderer_for = renderer_for
        self.json_out = json_out
        self.interactive = interactive
        self.exit_on_action = exit_on_action
        self.yolo = yolo
        self._buffer: deque[Any] = deque()
        self._pending: dict[str, tuple[str, Interaction]] = {}
        #: interactions answered from here or declined at the prompt (Ctrl-D)
        self._handled: set[str] = set()
        self._caught_up = False
        self._closed = False
        self._sub: Subscription | None = None
        self._until_idle = False
        self._after = 0
        #: conversations whose turn in flight was looked back at (see _journaled_before)
        self._looked_back: set[str] = set()
        self.conversation = ""
        #: the run followed (set by ``follow``, also when its ``send`` started it)
        self.run = ""

    # ------------------------------------------------------------------ main loop

    def follow(
        self,
        conversation: str | None,
        after: int = 0,
        *,
        run: str = "",
        send: Callable[[], str] | None = None,
        until_caught_up: bool = False,
        until_idle: bool = False,
    ) -> int:
        """Follow until the turn ``run`` ended (its exit code), until caught up
        (``until_caught_up``: 0), until no turn runs (``until_idle``: the exit
        code of the turn that ended, 0 if none ran), or until the conversation
        is closed (0).

        ``send``, when given, is called once the subscription is open and
        returns the run to follow (it sends the prompt); subscribe ``after``
        :data:`FROM_NOW` then. Otherwise follows until interrupted. Raises
        :class:`~agentctl.client.Unreachable` when the connection is lost.
        """
        self._until_idle = until_idle
        self._after = after if conversation is not None and after != FROM_NOW else 0
        self._sub = self.client.subscribe(conversation, after, dropped=self.dropped)
        self.conversation = conversation or ""
        if send is not None:
            # Sent once subscribed, so nothing of the turn is missed: its deltas go out live only,
            # and a quick turn can be over before a subscription made after the send begins.
            run = send()
        self.run = run
        tick = TICK_S if self.live else QUIET_S
        quiet_since = time.monotonic()
        try:
            while True:
                if self._buffer:
                    frame = self._buffer.popleft()
                else:
                    frame = self._sub.get(timeout=0) if self.live else None
                    if frame is None:
                        self._refresh()  # nothing waiting: draw the live region, then wait
                        frame = self._sub.get(timeout=tick)
                if frame is None:
                    if time.monotonic() - quiet_since < QUIET_S - 1e-3:
                        continue
                    quiet_since = time.monotonic()
                    code = self._quiet(run)
                else:
                    quiet_since = time.monotonic()
                    code = self._frame(frame, run, until_caught_up)
                if code is not None:
                    return code
        finally:
            self._flush()
            if self.notifier is not None:
                self.notifier.close()

    def _frame(self, frame: Any, run: str, until_caught_up: bool) -> int | None:
        if isinstance(frame, wire.SnapshotFrame):
            return self._snapshot(frame, until_caught_up)
        conv = frame.conversation
        self.conversation = conv
        rec = wire.decode_record(frame.record)
        self._emit_record(conv, rec)
        try:
            payload = wire.decode_payload(rec)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if rec.type == "interaction" and isinstance(payload, Interaction):
            if payload.state is InteractionState.PENDING:
                self._pending[payload.id] = (conv, payload)
            else:
                self._pending.pop(payload.id, None)
        elif rec.type == "answer" and isinstance(payload, AnswerRecord):
            self._pending.pop(payload.interaction_id, None)
        elif rec.type == "turn" and isinstance(payload, Turn) and payload.state.terminal:
            for iid in [i for i, (c, _) in self._pending.items() if c == conv]:
                del self._pending[iid]
            if run and rec.run == run:
                return self._finish(conv, run, payload)
            if self._until_idle and self._caught_up:
                return self._finish(conv, rec.run, payload)
        elif rec.type == "state" and isinstance(payload, wire.StateRecord):
            self._closed = payload.state is wire.ConversationState.CLOSED and self._caught_up
        return None

    def _snapshot(self, frame: wire.SnapshotFrame, until_caught_up: bool) -> int | None:
        conv, snap = frame.conversation, frame.snapshot
        self.conversation = conv
        if not self._caught_up and self._after > snap.last_seq:
            # A seq from another journal, or mistyped: nothing could be replayed, and silence hides it.
            self._say_err(f"seq {self._after} is past the last record of {conv} (seq {snap.last_seq}): "
                          "nothing to replay" + ("" if until_caught_up else "; following what comes next"))
        self._caught_up = True
        if self.json_out is not None:
            self._json(json_snapshot(conv, snap))
        elif self._renderer_for is not None:
            r = self._renderer_for(conv)
            if r not in self._renderers:
                self._renderers.append(r)
            unshown = {(it.agent_id, it.id) for it in r.unshown_items(snap)} if r.stream_deltas else set()
            if unshown and self._after and conv not in self._looked_back:
                # The replay may have started inside the turn in flight: the snapshot's items
                # journaled before that are not to be shown as if they were new.
                self._looked_back.add(conv)
                r.journaled(self._journaled_before(conv, snap, unshown))
            r.snapshot(conv, snap)
        for iid in [i for i, (c, _) in self._pending.items() if c == conv]:
            del self._pending[iid]
        for inter in snap.pending:
            self._pending[inter.id] = (conv, inter)
        if until_caught_up:
            return exitcodes.OK
        if self._until_idle and snap.state in (wire.ConversationState.IDLE, wire.ConversationState.CLOSED):
            return exitcodes.OK
        self._closed = snap.state is wire.ConversationState.CLOSED
        return None

    def _journaled_before(self, conv: str, snap: wire.Snapshot, unshown: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of ``unshown`` (items of the snapshot's turn) were journaled at or before ``after``.

        Reads the journal from the start of the turn in flight up to
        ``after`` on a second, short-lived subscription. When the turn ended
        meanwhile, all of them: what was still streaming then arrives as
        records anyway. When the journal cannot be read, none (shown as before).
        """
        try:
            info = self.client.call(wire.Show, wire.ConversationInfo, conversation=conv)
        except AgentdError:
            return set()
        if info.record.active_run != snap.run:
            return unshown
        stop = min(self._after, snap.last_seq)
        pos = info.record.turn_after
        if pos >= stop:
            return set()  # the replay covered the whole turn: nothing of it lies before
        found: set[tuple[str, str]] = set()
        try:
            sub = self.client.subscribe(conv, pos, snapshot=False)
        except AgentdError:
            return set()
        try:
            while pos < stop:
                frame = sub.get(timeout=LOOK_BACK_TIMEOUT_S)
                if frame is None:
                    break
                if not isinstance(frame, wire.EventFrame):
                    continue
                rec = wire.decode_record(frame.record)
                if not rec.seq:
                    continue  # live only
                pos = rec.seq
                if rec.seq > stop:
                    break
                if rec.type != "item":
                    continue
                try:
                    item = wire.decode_payload(rec)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if isinstance(item, Item) and (item.agent_id, item.id) in unshown:
                    found.add((item.agent_id, item.id))
        finally:
            sub.close()
        return found

    def _quiet(self, run: str) -> int | None:
        """Nothing arrived for a moment: act on what is pending, notice a closed conversation."""
        for r in self._renderers:
            r.settle()
        self._flush()
        if self._closed:
            if run:
                self._say_err("the conversation was closed before the turn ended")
                return exitcodes.FAILED
            return exitcodes.OK
        if not self._caught_up:
            return None
        for iid, (conv, inter) in list(self._pending.items()):
            if iid in self._handled:
                continue
            if inter.auto or (self.yolo and inter.kind is InteractionKind.PERMISSION):
                continue  # the daemon answers these
            if self.notifier is not None:
                kind = "form" if inter.elicitation is not None else inter.kind.value.replace("_", " ")
                self.notifier.waiting(conv, inter.id, kind, visible(inter.title))
            if self.interactive:
                self._prompt(conv, inter)
                return None
            if self.exit_on_action:
                return self._needs_action(conv, run, inter)
        return None

    # ------------------------------------------------------------------ outcomes

    def _finish(self, conv: str, run: str, turn: Turn) -> int:
        code = exitcodes.for_turn(turn.state)
        if self.json_out is not None:
            self._json(
                msgspec.json.encode(full(
                    FollowResult(
                        conversation=conv,
                        run=run,
                        state=turn.state.value,
                        exit_code=code,
                        error=turn.error,
                        reason=turn.reason,
                        inferred=turn.inferred,
                    )
                ))
            )
        return code

    def _needs_action(self, conv: str, run: str, inter: Interaction) -> int:
        code = exitcodes.NEEDS_ACTION
        if self.json_out is not None:
            self._json(
                msgspec.json.encode(full(
                    FollowResult(
                        conversation=conv, run=run, state="requires_action", exit_code=code, interaction=inter
                    )
                ))
            )
        message = f"needs action: interaction {inter.id} is pending (answer it with `agentctl answer`)"
        if self.json_out is not None:
            from .cli import _report

            _report(code, visible(message))  # {"code": "needs_action", ...}: the exit's error object
        else:
            self._say_err(message)
        return code

    # ------------------------------------------------------------------ answering at the terminal

    def _prompt(self, conv: str, inter: Interaction) -> None:
        from .prompting import Prompter, Resolved

        r = self._renderer_for(conv) if self._renderer_for is not None else None
        out = r.out if r is not None else sys.stdout
        style = r.style if r is not None else None
        if r is not None:
            r.end_line()

        def write(text: str) -> None:
            out.write(text)
            out.flush()

        prompter = Prompter(lambda prompt: self._read_line(prompt, conv, inter, write), write, style)
        while True:
            try:
                answer = prompter.ask(inter)
            except EOFError:
                self._handled.add(inter.id)
                write("\n")
                if r is not None:
                    r.hints(inter)
                return
            except Resolved:
                self._handled.add(inter.id)
                write("\n")
                return
            try:
                self.client.call(
                    wire.AnswerInteraction, Any, conversation=conv, interaction=inter.id, answer=answer
                )
            except Invalid as exc:
                prompter.say(prompter.style.yellow(f"  agentd refused the answer: {exc.message}"))
                continue
            except (InteractionGone, NotFound) as exc:
                prompter.say(prompter.style.dim(f"  not answered: {exc.message}"))
            self._handled.add(inter.id)
            return

    def _read_line(self, prompt: str, conv: str, inter: Interaction, write: Callable[[str], None]) -> str:
        """One line from the terminal; gives up (Resolved) if ``inter`` stops being pending meanwhile."""
        from .prompting import Resolved

        write(prompt)
        fd = sys.stdin.fileno()
        assert self._sub is not None
        while True:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    raise EOFError
                return data.decode("utf-8", "replace").rstrip("\r\n")
            while True:
                frame = self._sub.get(timeout=0)
                if frame is None:
                    break
                self._buffer.append(frame)
                if _resolves(frame, conv, inter):
                    raise Resolved

    # ------------------------------------------------------------------ output

    def _emit_record(self, conv: str, rec: wire.Record) -> None:
        if self.json_out is not None:
            self._json(json_record(conv, rec))
        elif self._renderer_for is not None:
            r = self._renderer_for(conv)
            if r not in self._renderers:
                self._renderers.append(r)
            r.record(conv, rec)

    def _refresh(self) -> None:
        for r in self._renderers:
            r.refresh()

    def end_lines(self) -> None:
        """End the renderers' open lines and clear their live regions (before a message, at the end)."""
        for r in self._renderers:
            r.end_line()
        sys.stdout.flush()

    def _json(self, data: bytes) -> None:
        assert self.json_out is not None
        self.json_out.write(data.decode() + "\n")
        self.json_out.flush()

    def _flush(self) -> None:
        if self.json_out is not None:
            self.json_out.flush()
        else:
            sys.stdout.flush()

    def _say_err(self, text: str) -> None:
        from .cli import _json_mode, _notice

        if _json_mode():
            return _notice(text)  # a {"notice"} line: under --json stderr holds JSON lines only
        self.end_lines()  # never into streamed text
        sys.stderr.write(visible(f"agentctl: {text}\n"))
        sys.stderr.flush()


def _resolves(frame: Any, conv: str, inter: Interaction) -> bool:
    """Whether ``frame`` ends ``inter``'s pendency."""
    if isinstance(frame, wire.SnapshotFrame):
        return frame.conversation == conv and all(p.id != inter.id for p in frame.snapshot.pending)
    if not isinstance(frame, wire.EventFrame) or frame.conversation != conv:
        return False
    rec = wire.decode_record(frame.record)
    if rec.type not in ("interaction", "answer", "turn"):
        return False
    try:
        payload = wire.decode_payload(rec)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    if isinstance(payload, Interaction):
        return payload.id == inter.id and payload.state is not InteractionState.PENDING
    if isinstance(payload, AnswerRecord):
        return payload.interaction_id == inter.id
    if isinstance(payload, Turn):
        return payload.state.terminal
    return False
