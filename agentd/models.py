"""Model selection: which model and effort level a conversation's next turns use.

Rules (the seed contract's ``Conversation.SetModel`` and ``Provider.Models``):

* A choice is checked against the provider's catalog before anything reaches the
  provider: an unknown model, or an effort level the chosen model does not list,
  is :class:`~agentd.contract.Invalid` and the message lists what is allowed. A
  provider that lists no models (``models()`` raises Unsupported: the script
  provider, Claude Code, Copilot with bring-your-own-key) leaves the check to the
  provider itself, which refuses what it cannot take when the choice is applied.
* A choice applies from the next turn on. While a turn runs it is refused
  :class:`~agentd.contract.Busy` unless the caller queues it (``after_turn``);
  a queued choice is applied right before the next prompt reaches the provider.
  A queued choice the provider refuses then is dropped: an ``error`` record names
  it and the prompt goes on with the model in use (it never blocks later prompts).
* A choice on an idle conversation holds the conversation's send lock from its
  last closed/busy check to its record, so no prompt starts (and nothing runs it
  twice) meanwhile; a conversation closed meanwhile answers Closed, its record and
  journal unchanged.
* Every choice the provider took is journaled as a ``model_selection`` record with
  ``source: "user"`` (the provider's confirmation, when it sends one, follows as its
  own ``model_selection`` record; a refused choice is not journaled) and kept in the
  conversation record (``model``, ``effort``), so a conversation reopened after a
  daemon restart asks its runtime for the same model again. A queued choice is
  journaled when queued (``queued: true``).

The conversation service stays the turn state machine: it calls
:func:`apply_queued` before it sends a prompt, and nothing else here is its code.
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
    from .runtimes import Runtimes

__all__ = ["apply_queued", "catalog", "check", "select"]

_json = msgspec.json.Encoder()
log = structlog.get_logger("agentd.models")


async def catalog(runtimes: "Runtimes", provider: str) -> list[c.Model] | None:
    """The provider's models, or None when it lists none (its ``models()`` is Unsupported).

    Raises NotFound for an unknown provider, RuntimeUnavailable when its runtime cannot start.
    """
    try:
        return await runtimes.models(provider)
    except c.Unsupported:
        return None


def check(models: list[c.Model] | None, model: str, effort: str, context_tier: str = "", *,
          open_catalog: bool = False) -> None:
    """Raise Invalid unless ``model`` (and ``effort``, ``context_tier``, when given) is in ``models``.

    ``model`` "" keeps the current model (``effort`` and ``context_tier`` are checked against
    every listed model's). ``models`` None checks nothing (see the module docstring).
    ``open_catalog``: a model not listed is left to the provider (the script provider takes
    any script path); a listed one is checked as usual. A context tier is refused unless the
    model lists it: a provider that lists none takes none.
    """
    if models is None:
        if context_tier:
            raise c.Invalid(f"unknown context tier {context_tier!r}: this provider lists no context tiers",
                            details={"context_tiers": []})
        return
    found = next((m for m in models if m.id == model), None) if model else None
    if model and found is None:
        if open_catalog:
            if context_tier:
                raise c.Invalid(f"unknown context tier {context_tier!r}: {model!r} lists no context tiers",
                                details={"context_tiers": []})
            return
        raise c.Invalid(f"unknown model {model!r}; this provider offers: {', '.join(m.id for m in models) or 'none'}",
                        details={"models": [m.id for m in models]})
    if found is not None:
        levels, tiers = list(found.efforts), [t.id for t in found.context_tiers]
    else:
        levels = sorted({e for m in models for e in m.efforts})
        tiers = sorted({t.id for m in models for t in m.context_tiers})
    what = f"model {model!r}" if model else "this provider"
    if effort and levels and effort not in levels:
        raise c.Invalid(f"unknown effort {effort!r} for {what}; allowed: {', '.join(levels)}",
                        details={"efforts": list(levels)})
    if context_tier and context_tier not in tiers:
        raise c.Invalid(f"unknown context tier {context_tier!r} for {what}; allowed: {', '.join(tiers) or 'none'}",
                        details={"context_tiers": tiers})


async def check_choice(runtimes: "Runtimes", provider: str, model: str, effort: str, context_tier: str = "", *,
                       workdir: str = "") -> None:
    """:func:`check` against ``provider``'s catalog (NotFound for an unknown provider).

    With ``workdir``, a model an open catalog does not list is also looked up as the provider
    will look it up when a conversation there opens (its ``resolve(model, workdir)``: the script
    provider's script path), so a conversation opened later (a task's) cannot fail on it.
    """
    prov = await runtimes.get(provider)
    models = await catalog(runtimes, provider)
    open_catalog = bool(getattr(prov, "open_catalog", False))
    check(models, model, effort, context_tier, open_catalog=open_catalog)
    listed = models is not None and any(m.id == model for m in models)
    if model and workdir and open_catalog and not listed and (resolve := getattr(prov, "resolve", None)) is not None:
        await trio.to_thread.run_sync(resolve, model, workdir)


async def select(service: "ConversationService", ref: str, model: str, effort: str = "", *,
                 after_turn: bool = False, context_tier: str = "") -> wire.ConversationRecord:
    """Choose ``model`` / ``effort`` for conversation ``ref`` from its next turn on.

    Idle: the conversation is opened on its runtime (if it is not) and the provider applies
    the choice now, so a choice it cannot take fails here, not in the next turn. Running:
    Busy, unless ``after_turn``, which queues the choice for the next prompt (a later
    choice replaces a queued one). Returns the conversation record.

    Raises NotFound, Closed, Busy, Invalid (see :func:`check`; also the provider's own
    refusal), Unsupported when the provider cannot change models, InternalError when the
    record cannot be written.
    """
    if not model and not effort and not context_tier:
        raise c.Invalid("give a model, an effort, a context tier, or several")
    live = await service.live(ref, open_only=True)  # a closed one is refused before it is loaded
    record = live.record
    if not (await service.runtimes.get(record.provider)).capabilities().set_model:
        raise c.Unsupported(f"provider {record.provider!r} cannot change a conversation's model")
    await check_choice(service.runtimes, record.provider, model or record.model, effort, context_tier)
    # The catalog check above may take a while: closed and busy are decided again under the send
    # lock, which a prompt's start holds too, so a choice never reaches a runtime mid-turn.
    async with live.send_lock:
        _refuse_closed(record)
        choice = wire.ModelChoice(model=model or record.model, effort=effort, context_tier=context_tier)
        if live.run:
            if not after_turn:
                raise c.Busy(f"a turn is running in {record.id} (run {live.run}); "
                             "the model can change after it (agentctl set-model --after-turn)")
            record.next_model = choice
            service.save_record(record)
            await service.journal(live, "model_selection", _json.encode(
                c.ModelSelection(model=choice.model, effort=choice.effort or None, source="user", queued=True,
                                 context_tier=choice.context_tier or None)))
            return record
        conv = await service.open_conversation(live)
        if record.state is wire.ConversationState.CLOSED:
            await service.detach(live)  # closed while it was opened: close() found nothing open to close
            _refuse_closed(record)
        await _set(conv, choice)
        _refuse_closed(record)  # closed while the provider took it: the closed record stays as it was
        await _keep(service, live, choice)
    return record


def _refuse_closed(record: wire.ConversationRecord) -> None:
    if record.state is wire.ConversationState.CLOSED:
        raise c.Closed(f"conversation {record.id} is closed")


async def apply_queued(service: "ConversationService", live: "_Live", conv: c.Conversation) -> None:
    """Apply the choice queued with ``after_turn``, if any, to ``conv`` before a prompt is sent.

    A choice the provider refuses (Invalid, Unsupported) is dropped, with an ``error`` record
    naming it, and the prompt goes on with the model in use: a refused choice left queued would
    fail every later prompt. Raises what else the provider's ``set_model`` raises (the choice
    stays queued then).
    """
    record = live.record
    choice = record.next_model
    if choice is None:
        return
    service.publish_held(live)  # the provider's answer is waited for
    try:
        await _set(conv, choice)
    except (c.Invalid, c.Unsupported) as exc:
        record.next_model = None
        service.save_record(record)
        current = record.model or "the provider's default model"
        message = (f"the model choice queued for this turn ({_describe(choice)}) was refused and dropped; "
                   f"this turn uses {current}: {exc.message}")
        log.warning("model.queued_choice_refused", conversation=record.id, run=live.run, model=choice.model,
                    effort=choice.effort, context_tier=choice.context_tier, error=exc.message)
        await service.journal(live, "error", _json.encode(wire.ErrorRecord(code=exc.code, message=message)))
        return
    await _keep(service, live, choice)


def _describe(choice: wire.ModelChoice) -> str:
    parts = [f"model {wire.clip(choice.model, 200)!r}" if choice.model else "the current model"]
    if choice.effort:
        parts.append(f"effort {wire.clip(choice.effort, 80)!r}")
    if choice.context_tier:
        parts.append(f"context tier {wire.clip(choice.context_tier, 80)!r}")
    return ", ".join(parts)


async def _set(conv: c.Conversation, choice: wire.ModelChoice) -> None:
    """Have the provider take ``choice``; raises its refusal."""
    if choice.context_tier:  # only providers whose catalog lists tiers take one (check refused the rest)
        await conv.set_model(choice.model, choice.effort, context_tier=choice.context_tier)  # type: ignore[call-arg]
    else:
        await conv.set_model(choice.model, choice.effort)


async def _keep(service: "ConversationService", live: "_Live", choice: wire.ModelChoice) -> None:
    """Record a choice the provider took: the conversation record, and its ``model_selection``.

    Journaled only once taken (a refused choice is not one made). Nothing yields between the
    provider's answer and the append, so the provider's confirmation, queued for the pump
    meanwhile, still follows it in the journal.
    """
    record = live.record
    record.model = choice.model
    record.effort = choice.effort
    record.context_tier = choice.context_tier
    record.next_model = None
    await service.journal(live, "model_selection", _json.encode(
        c.ModelSelection(model=choice.model, effort=choice.effort or None, source="user",
                         context_tier=choice.context_tier or None)))
    service.save_record(record)
