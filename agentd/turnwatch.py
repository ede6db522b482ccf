"""Turn watch: every turn ends exactly once, and never waits on its runtime without a bound.

The conversation service calls this module; it keeps these rules (issue 13, item 2):

* **Inactivity deadline.** A running turn whose runtime reported nothing at all (no event of
  any kind: no delta, no tool progress, no item) for ``[runtimes] silence_timeout_s`` seconds
  (default 600; 0 = off), while no interaction waits on a person, ends ``failed`` with reason
  ``runtime_silent`` and ``inferred`` set: agentd inferred the end, the runtime never reported
  it. ``hang_timeout_s`` (0 = off) is the older, usually shorter form of the same deadline; it
  ends the turn ``runtime_hung``. Either cancels the turn at the provider first (a runtime that
  ignores the cancel is stopped by its provider; the next prompt starts a fresh one).
* **Cancel grace.** A cancel the runtime does not confirm within ``[runtimes] cancel_timeout_s``
  (default 10 s) ends the turn ``cancelled``, reason ``cancel_timeout``, ``inferred``; ``cancel``
  returns that outcome (:class:`~agentd.wire.CancelResult`), so ``agentctl cancel`` reports it.
* **One end per turn.** A provider's terminal ``TurnEvent`` is tagged, as it is emitted, with the
  run whose prompt it was handed last (:class:`End`). An end whose run is no longer the running
  one (the service already ended it: a deadline, a cancel timeout, a journal failure), and a
  second end of the same provider turn, are dropped and logged (``turn.late_end_dropped``),
  never journaled: no run ever gets a second terminal record, and a late end never ends the
  run after it.
* **The next prompt is never refused busy** for a turn agentd already ended: before a prompt
  reaches the provider, :func:`settle` makes sure the provider's own turn is over. A provider
  still running a turn the service ended is cancelled (bounded by the cancel grace); if that is
  not enough, its conversation is closed and reopened (same runtime conversation id), and what
  the old one still reports is muted.

Units: seconds, trio's clock. Nothing here raises but what the provider's calls raise
(``settle`` propagates the errors of reopening the conversation: NotFound, RuntimeUnavailable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import structlog
import trio

from . import contract as c
from . import wire

if TYPE_CHECKING:
    from .conversations import ConversationService, _Live

log = structlog.get_logger("agentd.turnwatch")

#: Turn end reasons agentd sets itself.
RUNTIME_SILENT = "runtime_silent"
RUNTIME_HUNG = "runtime_hung"
CANCEL_TIMEOUT = "cancel_timeout"
#: reasons whose end agentd inferred (the runtime reported none)
INFERRED = frozenset({RUNTIME_SILENT, RUNTIME_HUNG, CANCEL_TIMEOUT})

_json = msgspec.json.Encoder()


class End:
    """A provider's terminal TurnEvent, tagged when it was emitted.

    ``run``: the run whose prompt the provider was handed last, if its provider turn was still
    open then ("" for a turn no prompt of ours started). ``duplicate``: that provider turn had
    already reported its end.
    """

    __slots__ = ("event", "run", "duplicate")

    def __init__(self, event: c.TurnEvent, run: str, duplicate: bool) -> None:
        self.event = event
        self.run = run
        self.duplicate = duplicate


class Exited:
    """A provider's ExitEvent, tagged when it was emitted: ``run`` is the run whose provider turn
    was open when the runtime exited ("" when none was: its turn had reported its end, as an ACP
    conversation reports it before the exit). Only that run goes down with the runtime; a run
    handed over after the exit was emitted (a queued one, sent while the pump had not yet
    handled the exit) went to a runtime started afresh. ``begun``: how many prompts had been
    handed to the provider conversation when it exited (:attr:`Tagger.begun`)."""

    __slots__ = ("event", "run", "begun")

    def __init__(self, event: c.ExitEvent, run: str, begun: int) -> None:
        self.event = event
        self.run = run
        self.begun = begun

    def stale(self, tagger: "Tagger") -> bool:
        """Whether a prompt was handed to the provider conversation after it emitted this exit:
        the conversation took it (it starts a new runtime itself), so it is still the one to use."""
        return tagger.begun != self.begun


class Tagger:
    """The per-open state a conversation's sink keeps: which run the provider works on.

    Called on the trio thread, at emit time (before the event is queued for the pump),
    so it sees the provider's own order of events.
    """

    __slots__ = ("run", "open", "muted", "begun")

    def __init__(self) -> None:
        #: the run whose prompt was last handed to the provider
        self.run = ""
        #: the provider's turn for ``run`` has not reported its end yet
        self.open = False
        #: the provider conversation was abandoned (closed to be reopened): drop what it emits
        self.muted = False
        #: prompts handed to the provider so far (see Exited.stale)
        self.begun = 0

    def begin(self, run: str) -> None:
        """``run``'s prompt is about to be handed to the provider."""
        self.run, self.open = run, True
        self.begun += 1

    def tag(self, event: c.Event) -> c.Event | End | Exited | None:
        """The event to queue: a terminal TurnEvent becomes an :class:`End`, an ExitEvent an
        :class:`Exited`; None when muted."""
        if self.muted:
            return None
        if type(event) is c.ExitEvent:
            exited = Exited(event, self.run if self.open else "", self.begun)
            self.open = False  # whatever turn it had open ended with it
            return exited
        if type(event) is c.TurnEvent:
            if event.turn.state.terminal:
                end = End(event, self.run if self.open else "", duplicate=not self.open and bool(self.run))
                self.open = False
                return end
            if not self.open:  # a turn the provider started by itself
                self.run, self.open = "", True
        return event


def late_end(live: "_Live", end: End) -> bool:
    """Whether ``end`` must be dropped: its run already ended here, or it is a second end.

    Logs the drop. An end of a turn no prompt of ours started (``run`` "") is not late.
    """
    if end.duplicate or (end.run and end.run != live.run):
        log.warning("turn.late_end_dropped", conversation=live.record.id, run=end.run or live.sink.tagger.run,
                    state=end.event.turn.state.value, reason=end.event.turn.reason,
                    why="a second end of the same turn" if end.duplicate else "the turn had already ended")
        return True
    return False


def deadline(service: "ConversationService") -> tuple[float, str]:
    """(seconds, reason) of the inactivity deadline in force; (0, "") when none is."""
    hang, silent = service.hang_timeout_s, service.silence_timeout_s
    if hang > 0 and (silent <= 0 or hang <= silent):
        return hang, RUNTIME_HUNG
    if silent > 0:
        return silent, RUNTIME_SILENT
    return 0.0, ""


async def watch(service: "ConversationService", live: "_Live", run: str) -> None:
    """Fail ``run`` once its runtime reported nothing for the inactivity deadline.

    A pending interaction (a person is asked) stops the clock. Returns when the run ends.
    """
    timeout, reason = deadline(service)
    if timeout <= 0:
        return
    done = live.turn_done  # this run's: the watch ends with the turn, not at its next wake-up
    while live.run == run and not done.is_set():
        now = trio.current_time()
        if live.pending:
            live.last_event = now
        idle = now - live.last_event
        if idle >= timeout:
            if live.failing_run != run:
                live.failing_run, live.fail_reason = run, reason
                live.fail_error = (f"the runtime reported nothing for {timeout:g} s and nobody was asked "
                                   "anything; agentd ended the turn")
                log.warning("turn.runtime_silent", conversation=live.record.id, run=run, reason=reason,
                            silent_s=round(idle, 1))
                await service._fail_turn(live, run)
            return
        with trio.move_on_after(timeout - idle):
            await done.wait()


def inferred_end(state: c.TurnState, reason: str, error: str, model: str = "") -> c.Turn:
    return c.Turn(state=state, reason=reason, error=error, model=model, inferred=reason in INFERRED)


async def cancel(service: "ConversationService", live: "_Live") -> wire.CancelResult:
    """Cancel the running turn and wait (up to the cancel grace) for its end.

    A turn still running after ``cancel_timeout_s`` ends ``cancelled``, reason
    ``cancel_timeout``, inferred. Returns how the turn ended; no turn: an empty result.
    Raises what the provider's cancel raises (other than taking too long).
    """
    run = live.run
    if not run:
        return wire.CancelResult()
    grace = service.cancel_timeout_s
    with trio.move_on_after(grace):
        await service._cancel(live)
        await live.turn_done.wait()
    if live.run == run:
        log.warning("turn.cancel_timeout", conversation=live.record.id, run=run, grace_s=grace)
        turn = inferred_end(c.TurnState.CANCELLED, CANCEL_TIMEOUT,
                            f"the runtime did not confirm the cancel within {grace:g} s; agentd ended the turn")
        await service._end_turn(live, turn, run)
    return live.ended.get(run, wire.CancelResult(run=run))


def note_end(live: "_Live", run: str, turn: c.Turn) -> None:
    """Remember how ``run`` ended (for a cancel waiting on it); only the latest few are kept."""
    ended = live.ended
    ended[run] = wire.CancelResult(run=run, state=turn.state.value, reason=turn.reason, error=turn.error,
                                   inferred=turn.inferred)
    while len(ended) > 8:
        ended.pop(next(iter(ended)))


async def settle(service: "ConversationService", live: "_Live", conv: c.Conversation) -> c.Conversation:
    """The provider conversation to hand the next prompt to, with no turn of its own running.

    When the provider still runs a turn the service already ended, it is cancelled; if it has
    not ended that turn within the cancel grace, the conversation is closed (muted first: what
    it still reports belongs to an ended run) and reopened. Returns the conversation to use.
    """
    tagger = live.sink.tagger
    if not tagger.open or not tagger.run or tagger.run == live.run:
        return conv
    stale = tagger.run
    log.warning("turn.provider_still_running", conversation=live.record.id, run=stale, next_run=live.run)
    service.publish_held(live)  # the cancel below is waited for
    with trio.move_on_after(service.cancel_timeout_s):
        try:
            await conv.cancel()
        except c.AgentdError as exc:
            log.warning("turn.cancel_failed", conversation=live.record.id, run=stale, error=exc.message)
        while tagger.open and live.sink.tagger is tagger:
            await trio.sleep(0.05)
    if not tagger.open or live.sink.tagger is not tagger:
        return live.conv or conv
    log.warning("turn.provider_reopened", conversation=live.record.id, run=stale,
                why="the provider did not end a turn agentd had ended")
    tagger.muted = True
    live.sink = type(live.sink)(live)  # a fresh sink (and tagger) for the reopened conversation
    live.conv = None
    with trio.move_on_after(service.cancel_timeout_s), trio.CancelScope(shield=True):
        try:
            await conv.close()
        except Exception as exc:  # the old conversation is dropped either way
            log.warning("conversation.close_failed", conversation=live.record.id, error=str(exc))
    return await service._ensure_open(live)

