"""agentctl answer: answer a pending interaction from the command line."""

from __future__ import annotations

import json
from typing import Any

import click

from agentd import wire
from agentd.contract import Answer, Interaction, InteractionKind, PlanAnswer

from .. import exitcodes
from ..cli import Fail, _ok_json, _opts, common


@click.command()
@click.argument("conversation")
@click.argument("interaction", required=False)
@click.option("--option", "option", metavar="ID", help="Permission: the option to pick.")
@click.option("--allow", is_flag=True, help="Permission: the allow-once option.")
@click.option("--deny", is_flag=True, help="Permission: the reject option.")
@click.option("--choice", multiple=True, metavar="N|TEXT",
              help="Question: a choice, by its number as listed (from 1) or its text (repeatable).")
@click.option("--text", "texts", multiple=True, metavar="TEXT",
              help="Question: a free-text answer (repeatable: one per question, in order).")
@click.option("--field", "fields", multiple=True, metavar="NAME=VALUE",
              help="Form: a field's value (repeatable; repeat a name for a multi-choice field).")
@click.option("--reject", is_flag=True, help="Question or form: decline to answer.")
@click.option("--dismiss", is_flag=True, help="Form or link: dismiss without declining.")
@click.option("--accept", is_flag=True, help="Link: accept (after opening it).")
@click.option("--action", metavar="ACTION", help="Plan review: the action to take (autopilot, interactive, exit_only).")
@click.option("--feedback", metavar="TEXT", help="Plan review: refuse the plan with this feedback.")
@common
def answer(
    conversation: str,
    interaction: str | None,
    option: str | None,
    allow: bool,
    deny: bool,
    choice: tuple[str, ...],
    texts: tuple[str, ...],
    fields: tuple[str, ...],
    reject: bool,
    dismiss: bool,
    accept: bool,
    action: str | None,
    feedback: str | None,
) -> None:
    """Answer a pending interaction (INTERACTION: an id or unique prefix;
    default: the only pending one).

    Exits 6 when nothing (or not that) is pending, 8 when the answer does not
    fit (a --choice that is no choice, even where free text is taken: that is
    --text; an --action the plan does not offer).

    \b
    Examples:
      agentctl answer c3f9 --allow                     # the pending permission, allow once
      agentctl answer c3f9 --option allow_always
      agentctl answer c3f9 --choice 2                  # a question's second choice
      agentctl answer c3f9 --text "use the staging database"
      agentctl answer c3f9 --field name=Ann --field lines=3
      agentctl answer c3f9 --action autopilot          # a plan review
    """
    o = _opts()
    info = o.client().call(wire.Show, wire.ConversationInfo, conversation=conversation)
    conv = info.record.id
    inter = _pick_interaction(conv, info.pending, interaction)
    ans = _build_answer(
        inter, option=option, allow=allow, deny=deny, choices=list(choice), texts=list(texts),
        fields=list(fields), reject=reject, dismiss=dismiss, accept=accept, action=action, feedback=feedback,
    )
    o.client().call(wire.AnswerInteraction, Any, conversation=conv, interaction=inter.id, answer=ans)
    if o.json:
        return _ok_json(conversation=conv, interaction=inter.id, answer=ans)
    from ..render import answer_summary, visible

    click.echo(visible(f"answered {inter.id}: {answer_summary(ans, inter)}"))


def _pick_interaction(conv: str, pending: list[Interaction], wanted: str | None) -> Interaction:
    if wanted:
        exact = [p for p in pending if p.id == wanted]
        matches = exact or [p for p in pending if p.id.startswith(wanted)]
        if not matches:
            raise Fail(exitcodes.NOT_FOUND, f"no pending interaction {wanted!r} in conversation {conv}: it was "
                                            "answered already, or never asked "
                                            f"(agentctl show {conv} lists the pending ones)")
        if len(matches) > 1:
            raise Fail(exitcodes.USAGE, f"{wanted!r} matches several pending interactions: "
                                        + ", ".join(p.id for p in matches))
        return matches[0]
    if not pending:
        raise Fail(exitcodes.NOT_FOUND, f"nothing is pending in conversation {conv}")
    if len(pending) > 1:
        raise Fail(exitcodes.USAGE, "several interactions are pending; name one: "
                                    + ", ".join(f"{p.id} ({p.kind.value}: {p.title})" for p in pending))
    return pending[0]


def _build_answer(
    inter: Interaction,
    *,
    option: str | None,
    allow: bool,
    deny: bool,
    choices: list[str],
    texts: list[str],
    fields: list[str],
    reject: bool,
    dismiss: bool,
    accept: bool,
    action: str | None,
    feedback: str | None,
) -> Answer:
    """Turn answer options into an :class:`Answer` for ``inter``.

    Raises :class:`Fail`: usage (2) when no answer was given, invalid (8)
    when the options do not fit the interaction's kind. Whether the values
    fit (a known option, an offered choice, a field's bounds) is for the
    daemon to decide.
    """
    perm = [x for x in (option is not None, allow, deny) if x]
    question = bool(choices or texts or fields or reject or dismiss or accept)
    plan = action is not None or feedback is not None
    given = len(perm) + question + plan
    kinds_given = bool(perm) + question + plan
    if given == 0:
        kind = _kind_phrase(inter).split(" ", 1)[1]
        raise Fail(exitcodes.USAGE, f"give an answer for {kind} {inter.id}: " + _answer_flags(inter))
    if kinds_given > 1:
        raise Fail(exitcodes.USAGE, "mixed answer options of different kinds: " + _answer_flags(inter))
    if inter.kind is InteractionKind.PERMISSION:
        if not perm:
            raise Fail(exitcodes.INVALID, f"{inter.id} is a permission request: {_answer_flags(inter)}")
        if len(perm) > 1:
            raise Fail(exitcodes.USAGE, "give one of --option, --allow, --deny")
        if option is not None:
            return Answer(decision=option)
        wanted = [o for o in inter.options if (o.allow_once if allow else o.reject)]
        if not wanted:
            raise Fail(exitcodes.INVALID, f"{inter.id} has no {'allow-once' if allow else 'reject'} option; "
                                          f"pick one with --option: {', '.join(o.id for o in inter.options)}")
        return Answer(decision=wanted[0].id)
    if inter.kind is InteractionKind.PLAN_REVIEW:
        if not plan:
            raise Fail(exitcodes.INVALID, f"{inter.id} is a plan review: {_answer_flags(inter)}")
        if action is not None and feedback is not None:
            raise Fail(exitcodes.USAGE, "give --action or --feedback, not both")
        if action is not None:
            offered = list(inter.plan.actions) if inter.plan else []
            if action not in offered:
                raise Fail(exitcodes.INVALID, f"--action {action} is not one of the actions {inter.id} offers: "
                                              f"{', '.join(offered) or 'none'} (or refuse the plan with --feedback TEXT)")
            return Answer(plan=PlanAnswer(action=action))  # type: ignore[arg-type]
        return Answer(plan=PlanAnswer(feedback=feedback or ""))
    # question, form or link
    if not question:
        raise Fail(exitcodes.INVALID, f"{inter.id} is {_kind_phrase(inter)}: {_answer_flags(inter)}")
    if sum((reject, dismiss, accept)) > 1 or ((reject or dismiss or accept) and (choices or texts or fields)):
        raise Fail(exitcodes.USAGE, "--reject, --dismiss and --accept stand alone")
    if reject:
        return Answer(reject=True)
    if dismiss:
        return Answer(cancel=True)
    qs = inter.questions
    answers: list[list[str]] = [[] for _ in qs]
    if accept:
        return Answer(answers=answers)
    if not qs:
        raise Fail(exitcodes.INVALID, f"{inter.id} asks nothing to fill in: use --accept, --reject or --dismiss")
    if _is_form(inter) and (choices or texts):
        # --choice/--text would fill no field: the daemon would only say which field is missing.
        raise Fail(exitcodes.INVALID, f"{inter.id} is a form: {_answer_flags(inter)}")
    if fields and not any(q.field is not None for q in qs):
        raise Fail(exitcodes.INVALID, f"{inter.id} is {_kind_phrase(inter)}, with no fields: {_answer_flags(inter)}")
    for spec in fields:
        name, sep, value = spec.partition("=")
        if not sep:
            raise Fail(exitcodes.USAGE, f"--field takes NAME=VALUE, not {spec!r}")
        idx = [i for i, q in enumerate(qs) if q.field is not None and q.field.name == name]
        if not idx:
            names = ", ".join(q.field.name for q in qs if q.field is not None) or "none"
            raise Fail(exitcodes.INVALID, f"{inter.id} has no field {name!r} (fields: {names})")
        q = qs[idx[0]]
        assert q.field is not None
        if q.field.type == "array" and "," in value and value not in q.choices and value not in q.field.values:
            # several choices in one flag, as the terminal prompt takes them (repeating --field works too)
            answers[idx[0]].extend(v.strip() for v in value.split(",") if v.strip())
        else:
            answers[idx[0]].append(value)
    plain = [i for i, q in enumerate(qs) if q.field is None] or list(range(len(qs)))
    for c in choices:
        offered = [i for i in plain if c in qs[i].choices]
        if not offered and c.strip().isdecimal():
            # A number picks a choice as the prompt lists them (from 1), in the next question
            # offering choices; a choice whose text is that number wins (above).
            with_choices = [i for i in plain if qs[i].choices]
            if with_choices:
                i = ([j for j in with_choices if not answers[j]] or with_choices)[0]
                n = int(c)
                if not 1 <= n <= len(qs[i].choices):
                    raise Fail(exitcodes.INVALID, _no_such_choice(inter, qs[i], c))
                answers[i].append(qs[i].choices[n - 1])
                continue
        if not offered:
            # Never taken as free text: a mistyped choice would go to the agent as the answer.
            with_choices = [i for i in plain if qs[i].choices]
            if with_choices:
                i = ([j for j in with_choices if not answers[j]] or with_choices)[0]
                raise Fail(exitcodes.INVALID, _no_such_choice(inter, qs[i], c))
            raise Fail(exitcodes.INVALID, f"{inter.id} offers no choices; give the answer in words with --text")
        open_ = [i for i in offered if not answers[i]]
        target = (open_ or offered)[0]
        answers[target].append(c)
    for t in texts:
        target = ([i for i in plain if not answers[i]] or [i for i in plain if qs[i].custom] or plain)[0]
        answers[target].append(t)
    return Answer(answers=answers)


def _no_such_choice(inter: Interaction, q: Any, given: str) -> str:
    listed = ", ".join(f"{n}) {text}" for n, text in enumerate(q.choices, 1))
    words = f"; to answer in words, use --text {json.dumps(given)}" if q.custom else ""
    about = f" for {q.header or q.text!r}" if len(inter.questions) > 1 else ""
    return (f"--choice {given} is not one of the choices{about}: give 1-{len(q.choices)} or the text "
            f"of one ({listed}){words}")


def _is_form(inter: Interaction) -> bool:
    """A form: every question is a field (answered with --field)."""
    return bool(inter.questions) and all(q.field is not None for q in inter.questions)


def _kind_phrase(inter: Interaction) -> str:
    if inter.kind is InteractionKind.PERMISSION:
        return "a permission request"
    if inter.kind is InteractionKind.PLAN_REVIEW:
        return "a plan review"
    if inter.elicitation is not None and not inter.questions:
        return "a link"
    if _is_form(inter):
        return "a form"
    return "a question"


def _answer_flags(inter: Interaction) -> str:
    if inter.kind is InteractionKind.PERMISSION:
        ids = ", ".join(o.id for o in inter.options)
        return f"use --allow, --deny or --option ID (options: {ids})"
    if inter.kind is InteractionKind.PLAN_REVIEW:
        acts = ", ".join(inter.plan.actions) if inter.plan else ""
        return f"use --action ACTION ({acts or 'none offered'}) or --feedback TEXT"
    if inter.elicitation is not None and not inter.questions:
        return "use --accept, --reject or --dismiss"
    names = ", ".join(q.field.name for q in inter.questions if q.field is not None)
    if _is_form(inter):
        return f"use --field NAME=VALUE (fields: {names}); or --reject, --dismiss"
    fields = f", --field NAME=VALUE (fields: {names})" if names else ""
    return f"use --choice N|TEXT, --text TEXT{fields}, or --reject"
