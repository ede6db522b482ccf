"""Idle release: a conversation whose runtime sat idle lets the runtime go, and gets it back on the next prompt.

An open conversation on Claude Code (or any runtime with one process per
conversation) holds a process of a few hundred MB while nobody uses it. With
``[runtimes] idle_release_s`` > 0, a conversation that has had no turn, no
pending interaction and no event for that long has its provider conversation
closed; the record, journal, lease and subscribers stay. The next prompt
reopens the exact runtime conversation (``OpenRequest.conversation_id``, as
after a daemon restart), so its history is the runtime's own and nothing is
resent. Only providers that can reopen (capability ``reopen``) are released.

One task scans the loaded conversations, and sleeps until the next one it saw
can fall idle (at least ``period`` seconds, at most ``idle_release_s``): no
timer per conversation, and one wake-up per ``idle_release_s`` while none can
be released. A conversation it did not count (busy, closed, opened later) has
its ``last_event`` stamped after the scan (by an event, its opening, or its
turn's end, whoever ended the turn), so it falls idle no sooner than
``idle_release_s`` after it: the next scan comes in time for it too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import structlog
import trio

if TYPE_CHECKING:
    from .conversations import ConversationService

log = structlog.get_logger("agentd.idle_release")

#: the most :func:`period` gives, in seconds
MAX_PERIOD_S = 30.0


def period(idle_release_s: float) -> float:
    """The least time between two scans, in seconds (how late a release may come): a quarter of
    the idle time, within [0.25, MAX_PERIOD_S]."""
    return min(MAX_PERIOD_S, max(0.25, idle_release_s / 4))


async def release_idle(service: ConversationService, idle_release_s: float) -> tuple[list[str], float]:
    """Close the provider conversation of every loaded conversation idle for ``idle_release_s``.

    Returns the ids released, and the earliest time (trio's clock) at which a
    conversation it looked at and kept falls idle (``inf``: none will). A
    conversation is idle when it has an open provider conversation, no run
    (active, opening or queued), no pending interaction, and its last event
    (or its opening, or its turn's end) is older than ``idle_release_s``
    seconds. A close that fails is logged and the conversation stays as it
    was. Never raises but Cancelled.
    """
    now = trio.current_time()
    cutoff = now - idle_release_s
    released: list[str] = []
    due = math.inf
    reopenable: dict[str, bool] = {}
    for live in list(service.loaded()):
        conv = live.conv
        if conv is None or live.run or live.opening_run or live.queue or live.pending:
            continue  # a run's end stamps last_event, as events do: idle from then on
        provider = live.record.provider
        if provider not in reopenable:
            try:
                reopenable[provider] = bool((await service.runtimes.get(provider)).capabilities().reopen)
            except Exception:
                reopenable[provider] = False
        if not reopenable[provider]:
            continue
        if live.last_event > cutoff:
            due = min(due, live.last_event + idle_release_s)
            continue
        async with live.open_lock:
            # Looked at again under the lock: a prompt may have come in meanwhile.
            if live.conv is not conv or live.run or live.opening_run or live.pending or live.last_event > cutoff:
                continue
            live.conv = None
            try:
                with trio.move_on_after(10):
                    await conv.close()
            except Exception as exc:
                log.warning("conversation.release_failed", conversation=live.record.id, error=str(exc))
                continue
        log.info("conversation.runtime_released", conversation=live.record.id, provider=provider,
                 idle_s=round(trio.current_time() - live.last_event, 1))
        released.append(live.record.id)
    return released, due


async def run(service: ConversationService, idle_release_s: float, *,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Release idle runtimes (see :func:`release_idle`) until cancelled; ``idle_release_s`` 0 = never.

    Scans when the next conversation it saw can fall idle, ``period`` seconds after the last scan
    at the soonest and ``idle_release_s`` at the latest (see the module's docstring).
    """
    task_status.started()
    if idle_release_s <= 0:
        return
    gap = period(idle_release_s)
    while True:
        now = trio.current_time()
        _, due = await release_idle(service, idle_release_s)
        await trio.sleep_until(max(now + gap, min(due, now + idle_release_s)))
