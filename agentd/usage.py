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

Nothing here does I/O or knows about trio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from .contract import TokenUsage, Usage

__all__ = ["Price", "add_report", "add_tokens", "budget_reached", "find_price", "price_of", "spent_text"]


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
