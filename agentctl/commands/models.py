"""agentctl's model commands: set-model (the model and effort of a conversation's next turns)."""

from __future__ import annotations

import click

from agentd import wire
from agentd.termsafe import visible_name

from ..cli import _json, _opts, common


@click.command("set-model")
@click.argument("conversation")
@click.argument("model", required=False, default="")
@click.option("--effort", default="", help="Effort level the model lists (agentctl models PROVIDER).")
@click.option("--context-tier", default="", metavar="TIER", help="Context tier the model lists (agentctl models PROVIDER).")
@click.option("--after-turn", is_flag=True, help="While a turn runs, apply it before the next prompt instead of failing busy.")
@common
def set_model(conversation: str, model: str, effort: str, context_tier: str, after_turn: bool) -> None:
    """Choose the model (and effort) of CONVERSATION's next turns.

    Checked against the provider's model list first (agentctl models
    PROVIDER): an unknown model, effort or context tier exits 8, naming
    what is allowed.
    While a turn runs it exits 7 (busy) unless --after-turn. Journaled, and
    kept across daemon restarts. --json: the conversation record.

    \b
    Examples:
      agentctl set-model c3f9 gpt-5 --effort high
      agentctl set-model c3f9 sonnet --after-turn
    """
    if not model and not effort and not context_tier:
        raise click.UsageError("give MODEL, --effort, --context-tier, or several")
    o = _opts()
    from .conversations import local_script

    client = o.client()
    if script := local_script(model):  # as `new` does, once the provider is known to be script
        if client.call(wire.Show, wire.ConversationInfo, conversation=conversation).record.provider == "script":
            model = script
    rec = client.call(wire.SetModel, wire.ConversationRecord, conversation=conversation, model=model,
                      effort=effort, after_turn=after_turn, context_tier=context_tier)
    if o.json:
        return _json(rec)
    if rec.next_model is not None:
        click.echo(f"{rec.id}: {visible_name(rec.next_model.model or rec.model or 'model unchanged')}"
                   f"{', effort ' + visible_name(rec.next_model.effort) if rec.next_model.effort else ''}"
                   " after the running turn")
    else:
        click.echo(f"{rec.id}: {visible_name(rec.model or 'model unchanged')}"
                   f"{', effort ' + visible_name(rec.effort) if rec.effort else ''}"
                   f"{', context ' + visible_name(rec.context_tier) if rec.context_tier else ''} from the next turn on")
