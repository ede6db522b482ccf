"""Usage accounting and budgets: pure functions over the contract's usage values.

The daemon keeps one running total per conversation (:class:`~agentd.contract.Usage`):
token counts summed from each model call the provider reports
(:class:`~agentd.contract.TokenUsage`), the provider's own units, and a cost
in USD. Where the money comes from, in order:

* the provider's running total (``UsageEvent.usage.cost_usd``) replaces the
  cost whenever it arrives: the provider knows what it charged;
* between two such totals, or for a provider that never reports money, each
  model call adds its own ``cost_usd``, else its price from the pricing table
  (``[pricing."<model>"]``, USD per million tokens); such a total is marked
  ``estimated``;
* a call of a model without a price adds nothing, and a conversation with no
  priced call has no cost at all (``cost_usd`` None), so its budget can never
  be reached. ``agentctl show`` says so.

The first half is pure functions over those values. The second half,
"Budgets of live conversations", applies a conversation's budget through the
conversation service's narrow surface (it journals, spawns, cancels and closes
only by calling the service): the service calls :func:`account` for each
usage report, :func:`refuse_at_budget` before a prompt, :func:`cut_short_turn`
and :func:`turn_ended` when a turn ends; the server calls :func:`set_budget`
and :func:`resume`. The rules it keeps:

* spend reaching the budget during a turn cuts the turn short (cancelled,
  reason ``budget``); on an idle conversation it pauses it (``budget_paused``)
  or, with ``on_reach = "stop"``, closes it; prompts queued behind the turn
  end unsent;
* a paused conversation refuses prompts (``limit``) until its budget is raised
  and ``continue`` resumes it; nothing is ever resent.

Nothing here imports trio.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import structlog

from . import contract as c
from . import wire
from .contract import TokenUsage, Usage

if TYPE_CHECKING:
    from .config import BudgetConfig
    from .conversations import ConversationService, _Live

__all__ = ["Price", "account", "add_report", "add_tokens", "budget_reached", "cut_short_turn", "find_price",
           "initial_budget", "price_of", "reached", "refuse_at_budget", "resume", "set_budget", "spent_text",
           "turn_ended"]

log = structlog.get_logger("agentd.usage")
_json = msgspec.json.Encoder()
_S = wire.ConversationState


class Price(Protocol):
    """USD per million tokens; ``cached_per_mtok`` None = cache reads cost the input price."""

    input_per_mtok: float
    output_per_mtok: float
    cached_per_mtok: float | None


def find_price(model: str, pricing: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: its exact key, else the longest key that prefixes it.

    ``claude-sonnet-4-5`` prices ``claude-sonnet-4-5-20250929``; keys compare
    case-insensitively. None when no key fits (or ``model`` is empty).
    """
    if not model or not pricing:
        return None
    exact = pricing.get(model)
    if exact is not None:
        return exact
    low = model.lower()
    best: tuple[int, Price] | None = None
    for key, price in pricing.items():
        k = key.lower()
        if low == k or low.startswith(k):
            if best is None or len(k) > best[0]:
                best = (len(k), price)
    return best[1] if best else None


def price_of(tokens: TokenUsage, price: Price) -> float:
    """USD of one model call. Cache reads at the cached price, other input (cache writes too) at the input price."""
    cached = min(tokens.cache_read, tokens.input)
    fresh = tokens.input - cached
    cached_rate = price.input_per_mtok if price.cached_per_mtok is None else price.cached_per_mtok
    return (fresh * price.input_per_mtok + cached * cached_rate + tokens.output * price.output_per_mtok) / 1e6


def add_tokens(total: Usage | None, tokens: TokenUsage, pricing: Mapping[str, Price]) -> Usage:
    """``total`` after one model call: tokens added, and its cost (reported, else priced) when known."""
    total = total or Usage()
    cost = total.cost_usd
    estimated = total.estimated
    if tokens.cost_usd is not None and math.isfinite(tokens.cost_usd):
        cost = (cost or 0.0) + max(tokens.cost_usd, 0.0)
    else:
        price = find_price(tokens.model, pricing)
        if price is not None:
            cost = (cost or 0.0) + price_of(tokens, price)
            estimated = True
    return msgspec.structs.replace(
        total,
        input_tokens=total.input_tokens + max(tokens.input, 0),
        output_tokens=total.output_tokens + max(tokens.output, 0),
        cached_tokens=total.cached_tokens + max(tokens.cache_read, 0),
        cost_usd=cost,
        estimated=estimated,
    )


def add_report(total: Usage | None, report: Usage) -> Usage:
    """``total`` after the provider's own running total ``report``.

    Its AI units and its cost (when it reports one) replace ours; its token
    totals replace ours when it reports any; so does its quota snapshot.
    """
    total = total or Usage()
    changes: dict[str, Any] = {}
    if report.ai_units:
        changes["ai_units"] = report.ai_units
    if report.cost_usd is not None and math.isfinite(report.cost_usd):
        changes["cost_usd"] = report.cost_usd
        changes["estimated"] = False
    if report.quota:
        changes["quota"] = list(report.quota)
    if report.input_tokens or report.output_tokens or report.cached_tokens:
        changes.update(input_tokens=report.input_tokens, output_tokens=report.output_tokens,
                       cached_tokens=report.cached_tokens)
    return msgspec.structs.replace(total, **changes) if changes else total


def budget_reached(usage: Usage | None, max_cost_usd: float | None) -> bool:
    """Whether spend has reached ``max_cost_usd`` (None: no limit; an unknown cost never reaches one)."""
    if max_cost_usd is None or usage is None or usage.cost_usd is None:
        return False
    return usage.cost_usd >= max_cost_usd


def spent_text(usage: Usage | None) -> str:
    """``$0.1234`` (``~$0.1234`` when estimated), or ``no cost known``."""
    if usage is None or usage.cost_usd is None:
        return "no cost known"
    return f"{'~' if usage.estimated else ''}${usage.cost_usd:.4f}"


# --------------------------------------------------------------------------- budgets of live conversations


def initial_budget(budget: wire.Budget | None, provider: str,
                   budgets: "Mapping[str, BudgetConfig]") -> tuple[wire.Budget | None, str]:
    """A new conversation's budget and where it came from (``new``, ``config``): ``budget`` as
    asked, else the provider's ``[budgets.<provider>]``; one without ``max_cost_usd`` is none."""
    source = "new"
    if budget is None and provider in budgets:
        default = budgets[provider]
        budget, source = wire.Budget(max_cost_usd=default.max_cost_usd, on_reach=default.on_reach), "config"
    if budget is not None and budget.max_cost_usd is None:
        budget = None
    return (None if budget is None else _normal(budget)), source


def _normal(budget: wire.Budget) -> wire.Budget:
    """``budget`` with a limit of -0.0 (which JSON can carry) made 0.0: shown and kept as $0."""
    if budget.max_cost_usd == 0 and math.copysign(1.0, budget.max_cost_usd) < 0:
        return msgspec.structs.replace(budget, max_cost_usd=0.0)
    return budget


async def account(service: "ConversationService", live: "_Live", run: str, *,
                  tokens: TokenUsage | None = None, report: Usage | None = None) -> None:
    """Fold one model call (``tokens``) or the provider's running total (``report``) into the
    conversation's total; journal the new total as a ``usage`` record, then apply the budget."""
    before = live.record.usage
    after = add_tokens(before, tokens, service.pricing) if tokens is not None else add_report(before, report or Usage())
    live.usage = after
    if after == before:
        return
    live.record.usage = after
    if not live.run:
        service._save_quietly(live.record)
    # else the record is saved when the turn ends, not now: a save is two fsyncs on the trio
    # thread, which would stall the turn (and every conversation) mid-stream for each model
    # call. Until then the journal's ``usage`` record holds the total; crash recovery takes it.
    await service._append(live, "usage", _json.encode(after), run=run)
    await _check(service, live)


def limit(live: "_Live") -> float | None:
    """The conversation's budget in USD, None when it has none."""
    budget = live.record.budget
    return None if budget is None else budget.max_cost_usd


def reached(live: "_Live") -> bool:
    """Whether the conversation's spend reached its budget."""
    return budget_reached(live.record.usage, limit(live))


def _details(live: "_Live") -> dict[str, Any]:
    usage = live.record.usage
    return {"state": live.record.state.value, "max_cost_usd": limit(live),
            "cost_usd": None if usage is None else usage.cost_usd}


def _message(live: "_Live") -> str:
    cid = live.record.id
    if reached(live):
        return (f"conversation {cid} reached its budget: spent {spent_text(live.record.usage)} of "
                f"${limit(live):.4f}; raise it (agentctl budget {cid} --max-cost-usd N), "
                f"then resume it (agentctl continue {cid})")
    return f"conversation {cid} is paused on its budget; resume it with agentctl continue {cid}"


def refuse_at_budget(live: "_Live") -> None:
    """Raise LimitExceeded (saying how to go on) while the conversation is paused on, or at, its budget."""
    if live.record.state is _S.BUDGET_PAUSED or reached(live):
        raise c.LimitExceeded(_message(live), details=_details(live))


def cut_short_turn(live: "_Live", turn: c.Turn) -> c.Turn:
    """``turn`` as it ends: a turn the budget cancelled says so (reason ``budget``, what was spent)."""
    if not live.budget_cut:
        return turn
    live.budget_cut = False
    if turn.state is not c.TurnState.CANCELLED:
        return turn
    of = f" of ${limit(live):.4f}" if limit(live) is not None else ""
    return msgspec.structs.replace(
        turn, reason="budget", error=f"cut short: the conversation reached its budget (spent {spent_text(live.record.usage)}{of})")


async def _check(service: "ConversationService", live: "_Live") -> None:
    """Apply the budget once spend reached it: a running turn is cut short (cancelled, recorded
    with reason ``budget``); an idle conversation pauses (``budget_paused``) or, with on_reach
    stop, is closed. Never waits for a turn to end: the pump calls this."""
    if live.record.state is _S.CLOSED or live.budget_closing or not reached(live):
        return
    if live.run:
        if not live.budget_cut:
            live.budget_cut = True
            log.info("budget.reached", conversation=live.record.id, run=live.run,
                     cost_usd=live.record.usage.cost_usd if live.record.usage else None, max_cost_usd=limit(live))
            service._spawn(_cut_short, service, live)
        return
    await _pause_or_stop(service, live)


async def _cut_short(service: "ConversationService", live: "_Live") -> None:
    budget = live.record.budget
    try:
        if budget is not None and budget.on_reach == "stop":
            live.budget_closing = True
            await service.close(live.record.id, reason="budget")
        else:
            await service._cancel(live)
    except c.AgentdError as exc:
        log.warning("budget.cut_short_failed", conversation=live.record.id, error=exc.message)


async def turn_ended(service: "ConversationService", live: "_Live") -> None:
    """The turn ended at or over the budget: queued prompts end unsent, then pause or stop."""
    queued, live.queue = list(live.queue), deque()
    live.record.queued = []
    live.queued_attachments.clear()
    for run, _text in queued:
        turn = c.Turn(state=c.TurnState.CANCELLED, reason="budget",
                      error="the conversation reached its budget before this queued prompt was sent; it was not sent")
        await service._append_or_publish(live, "turn", _json.encode(turn), run=run)
    await _pause_or_stop(service, live)


async def _pause_or_stop(service: "ConversationService", live: "_Live") -> None:
    budget = live.record.budget
    if budget is not None and budget.on_reach == "stop":
        if not live.budget_closing:
            live.budget_closing = True
            service._spawn(_close, service, live)
        return
    if live.record.state is _S.BUDGET_PAUSED:
        return
    live.record.state = _S.BUDGET_PAUSED
    service._save_quietly(live.record)
    log.info("budget.paused", conversation=live.record.id)
    state = wire.StateRecord(state=_S.BUDGET_PAUSED, reason="budget")
    await service._append_or_publish(live, "state", _json.encode(state), run="")


async def _close(service: "ConversationService", live: "_Live") -> None:
    try:
        await service.close(live.record.id, reason="budget")
    except c.AgentdError as exc:
        log.warning("budget.close_failed", conversation=live.record.id, error=exc.message)


async def set_budget(service: "ConversationService", ref: str, budget: wire.Budget, *,
                     by: str = "") -> wire.ConversationRecord:
    """Set, raise, lower or (``max_cost_usd`` None) remove conversation ``ref``'s budget; journaled
    as a ``budget`` record. A conversation paused on its budget stays paused until :func:`resume`;
    a budget already reached applies at once. Raises NotFound, Closed for a closed conversation."""
    live = await service.live(ref, open_only=True)  # a closed one is refused before it is loaded
    if live.record.state is _S.CLOSED:
        raise c.Closed(f"conversation {live.record.id} is closed")
    budget = _normal(budget)
    live.record.budget = budget if budget.max_cost_usd is not None else None
    service.save_record(live.record)
    change = wire.BudgetRecord(budget=budget, source="command", by=by)
    await service.journal(live, "budget", _json.encode(change))
    if live.record.state is not _S.BUDGET_PAUSED:
        await _check(service, live)
    return live.record


async def resume(service: "ConversationService", ref: str) -> wire.ConversationRecord:
    """``continue``: a conversation paused on its budget goes idle again, once under its budget.

    Never resends anything: a turn that was cut short stays as it ended. Raises NotFound,
    Invalid when the conversation is not ``budget_paused``, LimitExceeded while it is still at
    its budget.
    """
    live = await service.live(ref)
    record = live.record
    if record.state is not _S.BUDGET_PAUSED:
        raise c.Invalid(f"conversation {record.id} is {record.state.value}, not paused on its budget; "
                        "there is nothing to continue")
    if reached(live):
        raise c.LimitExceeded(_message(live), details=_details(live))
    record.state = _S.IDLE
    service.save_record(record)
    await service.journal(live, "state", _json.encode(wire.StateRecord(state=_S.IDLE, reason="continued")))
    return record
