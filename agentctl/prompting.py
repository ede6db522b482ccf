"""Answering interactions at the terminal.

:class:`Prompter` asks a person for the answer to one pending interaction,
using the numbering the renderer showed (options, choices and plan actions
count from 1), and returns an :class:`~agentd.contract.Answer`. It checks form
fields locally with :meth:`Question.field_value` so a typo is re-asked at
once; the daemon validates again and the caller re-asks when it refuses.

Input comes through ``read_line(prompt)``, which returns one line without its
newline, raises :class:`EOFError` when the person declines (Ctrl-D: answer
later with ``agentctl answer``) and :class:`Resolved` when someone else
answered meanwhile. Nothing here touches the socket.
"""

from __future__ import annotations

from collections.abc import Callable

from agentd.contract import (
    Answer,
    Interaction,
    InteractionKind,
    Invalid,
    PlanAnswer,
    Question,
)

from .render import Style, field_hint, shorten, visible


class Resolved(Exception):
    """The interaction stopped being pending while we asked (answered elsewhere, turn ended)."""


ReadLine = Callable[[str], str]


class Prompter:
    def __init__(self, read_line: ReadLine, write: Callable[[str], None], style: Style | None = None) -> None:
        self._read = read_line
        self._write = write
        self.style = style or Style(False)

    def say(self, text: str) -> None:
        self._write(text + "\n")

    def ask(self, inter: Interaction) -> Answer:
        """Ask until the person gives an answer that fits ``inter``."""
        if inter.kind is InteractionKind.PERMISSION:
            return self._permission(inter)
        if inter.kind is InteractionKind.PLAN_REVIEW:
            return self._plan(inter)
        return self._question(inter)

    # ------------------------------------------------------------------ kinds

    def _permission(self, inter: Interaction) -> Answer:
        opts = inter.options
        if not opts:
            raise EOFError("no options offered")
        self.say(self.style.dim("  (type a number or an option id; Ctrl-D to answer later)"))
        while True:
            raw = self._read(f"  choose 1-{len(opts)}: ").strip()
            if raw.isdecimal() and 1 <= int(raw) <= len(opts):
                return Answer(decision=opts[int(raw) - 1].id)
            for o in opts:
                if raw and raw.lower() in (o.id.lower(), o.label.lower()):
                    return Answer(decision=o.id)
            self.say(self.style.yellow(f"  type a number from 1 to {len(opts)}"))

    def _plan(self, inter: Interaction) -> Answer:
        actions = list(inter.plan.actions) if inter.plan else []
        prompt = f"  choose 1-{len(actions)}, or f to give feedback: " if actions else "  feedback: "
        self.say(self.style.dim("  (Ctrl-D to answer later)"))
        while True:
            if not actions:
                text = self._read(prompt).strip()
                if text:
                    return Answer(plan=PlanAnswer(feedback=text))
                continue
            raw = self._read(prompt).strip()
            if raw.isdecimal() and 1 <= int(raw) <= len(actions):
                return Answer(plan=PlanAnswer(action=actions[int(raw) - 1]))
            if raw in actions:
                return Answer(plan=PlanAnswer(action=raw))  # type: ignore[arg-type]
            if raw.lower() in ("f", "feedback"):
                text = self._read("  feedback: ").strip()
                if text:
                    return Answer(plan=PlanAnswer(feedback=text))
                self.say(self.style.yellow("  feedback cannot be empty"))
                continue
            self.say(self.style.yellow(f"  type a number from 1 to {len(actions)}, or f"))

    def _question(self, inter: Interaction) -> Answer:
        elicit = inter.elicitation
        escapes = "/reject to decline" + (", /cancel to dismiss" if elicit is not None else "")
        self.say(self.style.dim(f"  (type {escapes}; Ctrl-D to answer later)"))
        if elicit is not None and elicit.mode == "url" and not inter.questions:
            while True:
                raw = self._read("  once done there: a) accept, r) reject, c) cancel: ").strip().lower()
                if raw in ("a", "accept"):
                    return Answer(answers=[])
                if raw in ("r", "reject", "/reject"):
                    return Answer(reject=True)
                if raw in ("c", "cancel", "/cancel"):
                    return Answer(cancel=True)
        answers: list[list[str]] = []
        for q in inter.questions:
            values = self._one_question(q, len(inter.questions) > 1, elicit is not None)
            if values is None:
                return Answer(reject=True)
            if values == ["/cancel"]:
                return Answer(cancel=True)
            answers.append(values)
        return Answer(answers=answers)

    def _one_question(self, q: Question, several: bool, elicitation: bool) -> list[str] | None:
        label = visible(shorten(q.header or q.text, 40)) if several else ""
        while True:
            if q.field is not None:
                hint = field_hint(q)
                many = q.field.type == "array"
                if q.choices and q.field.type != "boolean":
                    hint += ", " + ("numbers or names, comma-separated" if many else "a number or a name")
                elif many:
                    hint += ", comma-separated"
                prompt = visible(f"  {q.field.name} ({hint}): ")
            elif q.choices:
                rng = f"1-{len(q.choices)}"
                how = f"{rng}, comma-separated" if q.multiple else rng
                if q.custom:
                    how += ", or type an answer"
                prompt = f"  {label + ' ' if label else ''}[{how}]: "
            else:
                prompt = f"  {label or 'answer'}: "
            raw = self._read(prompt)
            text = raw.strip()
            if text == "/reject":
                return None
            if text == "/cancel" and elicitation:
                return ["/cancel"]
            try:
                return self._parse(q, raw)
            except Invalid as exc:
                self.say(self.style.yellow(visible(f"  {exc.message}")))

    def _parse(self, q: Question, raw: str) -> list[str]:
        text = raw.strip()
        if q.field is not None:
            many = q.field.type == "array"
            tokens = [t.strip() for t in text.split(",")] if many else [text]
            values = [self._choice(q, t) or t for t in tokens if t]
            if q.field.type == "boolean" and text.lower() in ("y", "n"):
                values = ["yes" if text.lower() == "y" else "no"]
            q.field_value(values)  # raises Invalid with the reason
            return values
        if not text:
            raise Invalid("an answer is needed (or /reject)")
        if q.choices:
            tokens = [t.strip() for t in text.split(",")] if q.multiple else [text]
            picked = [self._choice(q, t) for t in tokens]
            if all(picked):
                return [p for p in picked if p]
            how = f"type a number from 1 to {len(q.choices)}" + (", or an answer in words" if q.custom else "")
            stray = [t for t, p in zip(tokens, picked) if p is None and t.isdecimal()]
            if stray:
                # A number is meant as a choice: taking it as free text would answer something else.
                raise Invalid(f"{stray[0]} is not one of the choices: {how}")
            if q.custom:
                return [raw.strip()]
            raise Invalid(how)
        return [raw.strip()]

    @staticmethod
    def _choice(q: Question, token: str) -> str | None:
        if token.isdecimal() and 1 <= int(token) <= len(q.choices):
            return q.choices[int(token) - 1]
        if token in q.choices:
            return token
        return None
