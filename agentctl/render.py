"""Terminal rendering of journal records, snapshots and results.

:class:`Renderer` turns the records of one conversation into what a person
reads: assistant text streamed as deltas arrive (reasoning dimmed), one line
per tool call and status, subagent start and finish lines, interactions as
prompts, the turn's outcome. Without colour (``NO_COLOR``, not a terminal) it
writes plain text with no ANSI sequence at all, so its output can be logged
and compared.

Rendering never raises on a record it cannot read: agentctl must keep
following a turn even when the daemon is newer than the client.

Agent-supplied text never reaches the output with its control characters
live: every record, snapshot and interaction passes
:func:`agentd.termsafe.visible_all` as it enters (``\x1b`` is printed as
those four characters), and so do table cells (:func:`table`).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, TextIO

import msgspec

from agentd import wire
from agentd.termsafe import visible, visible_all
from agentd.contract import (
    Answer,
    AnswerRecord,
    Delta,
    Interaction,
    InteractionKind,
    InteractionState,
    Item,
    ItemKind,
    Question,
    Subagent,
    SubagentStatus,
    TodoList,
    ToolStatus,
    Turn,
    TurnState,
)

from .jsonout import full  # noqa: F401  (re-exported: agentctl.render.full)


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (to anything non-empty)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _unicode_ok(stream: TextIO) -> bool:
    enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    return enc.startswith("utf")


class Style:
    """ANSI styling, or the identity when colour is off."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def _sgr(self, code: str, text: str) -> str:
        if not self.color or not text:
            return text
        return f"\x1b[{code}m{text}\x1b[0m"

    def bold(self, t: str) -> str:
        return self._sgr("1", t)

    def dim(self, t: str) -> str:
        return self._sgr("2", t)

    def italic_dim(self, t: str) -> str:
        return self._sgr("2;3", t)

    def red(self, t: str) -> str:
        return self._sgr("31", t)

    def green(self, t: str) -> str:
        return self._sgr("32", t)

    def yellow(self, t: str) -> str:
        return self._sgr("33", t)

    def cyan(self, t: str) -> str:
        return self._sgr("36", t)


#: lines of a finished tool's output shown under it (the end of it)
TOOL_OUTPUT_LINES = 3

_GLYPHS_UNICODE = {
    "prompt": "›",
    "tool_running": "⚙",
    "tool_ok": "✓",
    "tool_failed": "✗",
    "ok": "✓",
    "failed": "✗",
    "cancelled": "⊘",
    "sub_start": "▸",
    "sub_end": "◂",
    "ask": "?",
    "resolved": "↳",
    "reasoning": "┊ ",
    "notice": "!",
    "info": "·",
    "ellipsis": "…",
}
_GLYPHS_ASCII = {
    "prompt": ">",
    "tool_running": "*",
    "tool_ok": "+",
    "tool_failed": "x",
    "ok": "+",
    "failed": "x",
    "cancelled": "-",
    "sub_start": ">",
    "sub_end": "<",
    "ask": "?",
    "resolved": "->",
    "reasoning": "| ",
    "notice": "!",
    "info": "-",
    "ellipsis": "...",
}


def shorten(text: str, width: int, ellipsis: str = "…") -> str:
    """The first line of ``text``, whitespace collapsed, cut to ``width`` characters."""
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    more = len(text.strip().splitlines()) > 1
    if len(first) > width:
        return first[: max(0, width - len(ellipsis))] + ellipsis
    return first + (ellipsis if more and len(first) + len(ellipsis) <= width else "")


def _dump(obj: Any) -> str:
    return msgspec.json.encode(obj).decode()


# ---------------------------------------------------------------------- answering hints


def answer_commands(conversation: str, inter: Interaction, socket: str | None = None) -> list[str]:
    """The exact ``agentctl answer`` command lines that answer ``inter``.

    Upper-case words (TEXT, VALUE) stand for what the person fills in.
    """
    base = ["agentctl"]
    if socket:
        base += ["--socket", socket]
    base += ["answer", conversation, inter.id]

    def cmd(*args: str) -> str:
        return shlex.join([*base, *args])

    if inter.kind is InteractionKind.PERMISSION:
        out = []
        if any(o.allow_once for o in inter.options):
            out.append(cmd("--allow"))
        if any(o.reject for o in inter.options):
            out.append(cmd("--deny"))
        out.append(cmd("--option", "ID"))
        return out
    if inter.kind is InteractionKind.PLAN_REVIEW:
        actions = inter.plan.actions if inter.plan else []
        out = [cmd("--action", a) for a in actions]
        out.append(cmd("--feedback", "TEXT"))
        return out
    # question
    out = []
    if inter.elicitation is not None and not inter.questions:
        out.append(cmd("--accept"))
    elif inter.questions and all(q.field is not None for q in inter.questions):
        args: list[str] = []
        for q in inter.questions:
            f = q.field
            assert f is not None
            args += ["--field", f"{f.name}={_field_placeholder(q)}"]
        out.append(cmd(*args))
    else:
        args = []
        for q in inter.questions:
            if q.field is not None:
                args += ["--field", f"{q.field.name}={_field_placeholder(q)}"]
            elif q.choices:
                args += ["--choice", "CHOICE"]
            else:
                args += ["--text", "TEXT"]
        out.append(cmd(*args))
        if any(q.custom and q.choices for q in inter.questions):
            out.append(cmd("--text", "TEXT"))
    out.append(cmd("--reject"))
    if inter.elicitation is not None:
        out.append(cmd("--dismiss"))
    return out


def _field_placeholder(q: Question) -> str:
    f = q.field
    assert f is not None
    if f.type == "boolean":
        return "yes|no"
    if q.choices:
        return "|".join(q.choices) if len(q.choices) <= 4 else "CHOICE"
    return {"number": "NUMBER", "integer": "INTEGER", "array": "VALUE"}.get(f.type, "TEXT")


def field_hint(q: Question) -> str:
    """Type and bounds of a form field, e.g. ``integer, 1..10, required``."""
    f = q.field
    if f is None:
        return ""
    parts: list[str] = [f.format or f.type]
    if f.type == "boolean":
        parts = ["yes/no"]
    if f.minimum is not None or f.maximum is not None:
        parts.append(_bounds(f.minimum, f.maximum, ""))
    if f.min_length is not None or f.max_length is not None:
        parts.append(_bounds(f.min_length, f.max_length, " chars"))
    if f.min_items is not None or f.max_items is not None:
        parts.append(_bounds(f.min_items, f.max_items, " choices"))
    parts.append("required" if f.required else "optional")
    return ", ".join(parts)


def _bounds(lo: float | None, hi: float | None, unit: str) -> str:
    if lo is not None and hi is not None:
        return f"{lo:g}..{hi:g}{unit}"
    if lo is not None:
        return f">= {lo:g}{unit}"
    return f"<= {hi:g}{unit}"


def answer_summary(answer: Answer, inter: Interaction | None = None) -> str:
    """A short human line for an answer; with its interaction, option labels and field names."""
    if answer.decision:
        labels = {o.id: o.label for o in inter.options} if inter is not None else {}
        return labels.get(answer.decision) or answer.decision
    if answer.plan is not None:
        return answer.plan.action or f"feedback: {answer.plan.feedback}"
    if answer.reject:
        return "rejected"
    if answer.cancel:
        return "dismissed"
    questions = inter.questions if inter is not None else []
    parts = []
    for i, values in enumerate(answer.answers):
        text = ", ".join(v for v in values if v)
        field = questions[i].field if i < len(questions) else None
        parts.append(f"{field.name}={text}" if field is not None else text)
    return "; ".join(parts) or "accepted"


# ---------------------------------------------------------------------- the renderer


class Renderer:
    """Renders one conversation's records to ``out``.

    ``stream_deltas`` prints assistant text as deltas arrive (off when several
    conversations interleave: text then appears once its item is journaled).
    ``prefix`` starts every line (the conversation, for ``tail --all``).
    ``answer_hints`` prints, under a pending interaction, the commands that
    answer it; ``socket`` is added to them when not the default. ``seq``
    starts the first line each durable record prints with its seq, dimmed
    (``#12``: what ``tail --after`` takes). With
    ``replay`` the records first come from the journal, up to a snapshot:
    hints then wait for the snapshot and are shown only for interactions
    still pending in it, so no hint stands under an interaction that the
    same output shows answered a few lines later.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        color: bool | None = None,
        stream_deltas: bool = True,
        prefix: str = "",
        answer_hints: bool = True,
        socket: str | None = None,
        width: int | None = None,
        unicode: bool | None = None,
        yolo: bool = False,
        replay: bool = False,
        seq: bool = False,
    ) -> None:
        self.out = out if out is not None else sys.stdout
        self.style = Style(use_color(self.out) if color is None else color)
        self.g = _GLYPHS_UNICODE if (_unicode_ok(self.out) if unicode is None else unicode) else _GLYPHS_ASCII
        self.stream_deltas = stream_deltas
        self.prefix = prefix
        self.answer_hints = answer_hints
        self.socket = socket
        #: the conversation is in yolo mode: agentd answers permission requests itself
        self.yolo = yolo
        #: records are a replay until the next snapshot: answer hints wait for it
        self.replay = replay
        #: mark each line a durable record printed with its seq (``#12``), for ``tail --after``
        self.show_seq = seq
        self._seq_tag = ""
        if width is None:
            width = 100
            if self.style.color:
                import shutil

                width = shutil.get_terminal_size((100, 24)).columns
        self.width = max(40, width)
        self.conversation = ""
        # output position
        self._mid_line = False
        self._stream_key: tuple[str, str] | None = None
        self._at_line_start = True
        self._last_line_key: Any = None
        # what was shown already
        self._printed: dict[tuple[str, str], str] = {}
        #: text items known to be journaled (shown from their record, or journaled before the
        #: replay started): a snapshot never shows them again
        self._journaled: set[tuple[str, str]] = set()
        self._tool_status: dict[tuple[str, str], str] = {}
        self._shown_pending: set[str] = set()
        #: interactions shown pending during a replay whose answer hints wait for the snapshot
        self._hints_due: dict[str, Interaction] = {}
        self._resolved: set[str] = set()
        #: interactions yolo mode answers (or answered)
        self._auto: set[str] = set()
        #: every interaction seen, by id: its options and fields name what an answer chose
        self._asked: dict[str, Interaction] = {}
        self._prompts: list[str] = []
        self._subagents: dict[str, Subagent] = {}
        self._sub_status: dict[str, str] = {}
        self._title = ""
        self._todos_line = ""

    # -------------------------------------------------------------- output primitives

    def _write(self, text: str) -> None:
        if not text:
            return
        self.out.write(text)

    def flush(self) -> None:
        try:
            self.out.flush()
        except (AttributeError, ValueError):
            pass

    def end_line(self) -> None:
        """Finish a line left open by streamed text."""
        if self._mid_line:
            self._write("\n")
            self._mid_line = False
        self._at_line_start = True
        self._stream_key = None

    def line(self, text: str = "", *, key: Any = None) -> None:
        """Print one full line (or several), closing any open stream first."""
        self.end_line()
        for part in text.split("\n"):
            self._write(f"{self.prefix}{self._take_seq_tag()}{part}\n")
        self._last_line_key = key

    def _take_seq_tag(self) -> str:
        tag, self._seq_tag = self._seq_tag, ""
        return tag

    def _stream(self, key: tuple[str, str], kind: ItemKind, text: str) -> None:
        if self._stream_key != key:
            self.end_line()
            self._stream_key = key
        agent = key[0]
        lead = self.prefix
        if agent:
            lead += self.style.cyan(f"[{self._agent_name(agent)}] ")
        if kind is ItemKind.REASONING:
            lead += self.style.dim(self.g["reasoning"])
            paint = self.style.italic_dim
        else:
            paint = str
        parts = text.split("\n")
        for i, part in enumerate(parts):
            if i > 0:
                self._write("\n")
                self._at_line_start = True
                self._mid_line = False
            if part:
                if self._at_line_start:
                    self._write(self.prefix + self._take_seq_tag() + lead[len(self.prefix):])
                    self._at_line_start = False
                self._write(paint(part))
                self._mid_line = True
        self._last_line_key = None

    def _agent_name(self, agent_id: str) -> str:
        s = self._subagents.get(agent_id)
        return s.name if s and s.name else agent_id[:8]

    # -------------------------------------------------------------- records

    def record(self, conversation: str, rec: wire.Record) -> None:
        """Render one journal (or live) record of ``conversation``."""
        self.conversation = conversation or self.conversation
        try:
            payload = visible_all(wire.decode_payload(rec))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        handler = getattr(self, f"_on_{rec.type}", None)
        if handler is None:
            return
        if self.show_seq and rec.seq:
            self._seq_tag = self.style.dim(f"#{rec.seq}") + " "
        if rec.dropped:  # a turn a rewind dropped, shown because tail/attach --all asked
            self._seq_tag += self.style.dim("[dropped]") + " "
        try:
            handler(rec, payload)
        finally:
            self._seq_tag = ""

    def history_entry(self, entry: wire.HistoryEntry) -> None:
        """Render one entry of a history page (``agentctl history``), tagged with its seq when
        ``seq`` is on; each entry stands alone (no prompt is matched against a user item)."""
        if self.show_seq and entry.seq:
            self._seq_tag = self.style.dim(f"#{entry.seq}") + " "
        if entry.dropped:
            self._seq_tag += self.style.dim("[dropped]") + " "
        try:
            self.end_line()
            self._printed.pop((entry.item.agent_id, entry.item.id), None)
            self.item(entry.item)
            self.end_line()
        finally:
            self._seq_tag = ""

    def _on_conversation(self, rec: wire.Record, c: wire.ConversationCreated) -> None:
        self.yolo = c.mode == "yolo"
        bits = [c.provider, c.workdir]
        if c.model:
            bits.append(c.model)
        if c.mode != "interactive":
            bits.append(c.mode)
        self.line(self.style.dim(f"{self.g['info']} conversation {self.conversation} ({', '.join(bits)})"))

    def _on_prompt(self, rec: wire.Record, p: wire.PromptRecord) -> None:
        self._prompts.append(p.text)
        lines = p.text.splitlines() or [""]
        head = f"{self.g['prompt']} {lines[0]}"
        rest = [f"  {ln}" for ln in lines[1:]]
        note = "" if p.disposition in ("", "started") else self.style.dim(f" ({p.disposition})")
        if p.attachments:
            note += self.style.dim(f"  [attached: {', '.join(a.name for a in p.attachments)}]")
        self.line(self.style.bold("\n".join([head, *rest])) + note)

    def _on_item(self, rec: wire.Record, item: Item) -> None:
        if item.kind in (ItemKind.ASSISTANT, ItemKind.REASONING):
            self._journaled.add((item.agent_id, item.id))
        self.item(item)

    def item(self, item: Item) -> None:
        key = (item.agent_id, item.id)
        if item.kind is ItemKind.USER:
            if item.text in self._prompts:
                self._prompts.remove(item.text)
                return
            note = self.style.dim(" (steer)") if item.delivery == "steer" else ""
            self.line(self.style.bold(f"{self.g['prompt']} {item.text}") + note)
            return
        if item.kind in (ItemKind.ASSISTANT, ItemKind.REASONING):
            done = self._printed.get(key, "")
            text = item.text
            if done.startswith(text):
                return  # nothing new (an older view of the same text)
            if text.startswith(done):
                rest = text[len(done):]
            else:
                rest = text
                self.end_line()
            if rest:
                self._stream(key, item.kind, rest)
            self._printed[key] = text
            return
        if item.kind is ItemKind.TOOL and item.tool is not None:
            self._tool(item)
            return
        if item.kind is ItemKind.NOTICE and item.text:
            self.line(self.style.yellow(f"{self.g['notice']} {item.text}"))

    def _tool(self, item: Item) -> None:
        t = item.tool
        assert t is not None
        key = (item.agent_id, item.id)
        status = "running" if t.status in (ToolStatus.PENDING, ToolStatus.RUNNING) else t.status.value
        if self._tool_status.get(key) == status:
            return
        rewrite = (
            self.style.color
            and status != "running"
            and self._last_line_key == ("tool", key)
            and not self._mid_line
            and not self.prefix
        )
        self._tool_status[key] = status
        lead = ""
        if item.agent_id:
            lead = self.style.cyan(f"[{self._agent_name(item.agent_id)}] ")
        summary_src = t.input or t.title
        name = t.name
        if status == "running":
            glyph, tail = self.style.dim(self.g["tool_running"]), self.style.dim("running")
        elif status == "completed":
            glyph = self.style.green(self.g["tool_ok"])
            tail = self.style.dim("completed" + (f", exit {t.exit_code}" if t.exit_code is not None else ""))
        else:
            glyph = self.style.red(self.g["tool_failed"])
            why = f", exit {t.exit_code}" if t.exit_code is not None else ""
            out = shorten(t.output, 60, self.g["ellipsis"]) if t.output else ""
            tail = self.style.red("failed" + why + (f": {out}" if out else ""))
        room = self.width - len(self.prefix) - len(name) - 24
        summary = shorten(summary_src, max(10, room), self.g["ellipsis"]) if summary_src else ""
        text = f"{lead}{glyph} {self.style.bold(name)}"
        if summary:
            text += f" {summary}"
        text += f"  {tail}"
        if rewrite:
            self._write("\x1b[1A\r\x1b[2K")
        self.line(text, key=("tool", key))
        if status == "completed" and t.output:
            # The end of what it printed, as a terminal would have shown it last.
            lines = [ln for ln in t.output.splitlines() if ln.strip()][-TOOL_OUTPUT_LINES:]
            indent = " " * (len(self.g["tool_ok"]) + 1)
            room = max(10, self.width - len(self.prefix) - len(indent) - (len(self._agent_name(item.agent_id)) + 3 if lead else 0))
            for ln in lines:
                self.line(lead + self.style.dim(indent + shorten(ln, room, self.g["ellipsis"])))

    def _on_delta(self, rec: wire.Record, d: Delta) -> None:
        self.delta(d)

    def delta(self, d: Delta) -> None:
        if not self.stream_deltas or d.agent_id or d.kind not in (ItemKind.ASSISTANT, ItemKind.REASONING):
            return
        key = (d.agent_id, d.item_id)
        self._stream(key, d.kind, d.text)
        self._printed[key] = self._printed.get(key, "") + d.text

    def _on_turn(self, rec: wire.Record, turn: Turn) -> None:
        self.turn(turn)

    def turn(self, turn: Turn) -> None:
        if turn.state is TurnState.WORKING:
            return
        self.end_line()
        if turn.state is TurnState.COMPLETED:
            self.line(self.style.green(f"{self.g['ok']} turn completed"))
        elif turn.state is TurnState.CANCELLED:
            why = f": {turn.error}" if turn.reason in ("budget", "cancel_timeout") and turn.error else ""
            self.line(self.style.yellow(f"{self.g['cancelled']} turn cancelled{why}"))
        else:
            why = turn.error or turn.reason
            self.line(self.style.red(f"{self.g['failed']} turn failed" + (f": {why}" if why else "")))
        # whatever was pending ended with the turn
        self._shown_pending.clear()
        self._hints_due.clear()

    def _on_interaction(self, rec: wire.Record, inter: Interaction) -> None:
        self.interaction(inter)

    def interaction(self, inter: Interaction, *, hints: bool | None = None) -> None:
        """Show a pending interaction once (numbered options, how to answer), or its resolution."""
        inter = visible_all(inter)
        if inter.auto:
            self._auto.add(inter.id)
        self._asked[inter.id] = inter
        if inter.state is InteractionState.PENDING:
            if inter.id in self._shown_pending or inter.id in self._resolved or inter.id in self._auto:
                return  # shown already, or yolo answers it at once (its resolution is shown)
            self._shown_pending.add(inter.id)
            self.line("\n".join(self.interaction_lines(inter)), key=("interaction", inter.id))
            if hints is None:
                hints = self.answer_hints and not (self.yolo and inter.kind is InteractionKind.PERMISSION)
            if hints and self.replay:
                self._hints_due[inter.id] = inter  # unless it is answered later in the replay
            elif hints:
                self.hints(inter)
            return
        self._hints_due.pop(inter.id, None)
        if inter.id in self._resolved:
            return
        self._resolved.add(inter.id)
        self._shown_pending.discard(inter.id)
        how = f"{inter.state.value} {inter.id}" + (f" ({inter.title})" if inter.title else "")
        if inter.resolution:
            labels = {o.id: o.label for o in inter.options}
            how += f": {labels.get(inter.resolution, inter.resolution)}"
        if inter.id in self._auto:
            how += " (yolo)"
        self.line(self.style.dim(f"  {self.g['resolved']} {how}"))

    def hints(self, inter: Interaction) -> None:
        cmds = answer_commands(self.conversation, visible_all(inter), self.socket)
        lines = [f"  answer with: {cmds[0]}"] + [f"          or: {c}" for c in cmds[1:]]
        self.line(self.style.dim("\n".join(lines)))

    def interaction_lines(self, inter: Interaction) -> list[str]:
        """The lines that show a pending interaction; options and choices numbered from 1."""
        s = self.style
        kind = {"permission": "permission", "question": "question", "plan_review": "plan review"}[inter.kind.value]
        if inter.elicitation is not None:
            kind = "form" if inter.elicitation.mode == "form" else "link"
        who = f"[{self._agent_name(inter.agent_id)}] " if inter.agent_id else ""
        out = [s.yellow(s.bold(f"{self.g['ask']} {who}{kind}: {inter.title}"))]
        if inter.detail:
            detail = inter.detail.rstrip().splitlines()
            for ln in detail[:20]:
                out.append(f"  {ln}")
            if len(detail) > 20:
                out.append(s.dim(f"  {self.g['ellipsis']} {len(detail) - 20} more lines"))
        if inter.kind is InteractionKind.PERMISSION:
            for i, o in enumerate(inter.options, 1):
                flag = "--allow" if o.allow_once else "--deny" if o.reject else f"--option {o.id}"
                hint = s.dim(f"  [{flag}]") if self.answer_hints else ""
                out.append(f"  {i}) {o.label or o.id}{hint}")
        elif inter.kind is InteractionKind.PLAN_REVIEW and inter.plan is not None:
            p = inter.plan
            if p.summary:
                out.append(f"  {p.summary}")
            if p.content:
                body = p.content.rstrip().splitlines()
                for ln in body[:40]:
                    out.append(s.dim(f"  | {ln}"))
                if len(body) > 40:
                    out.append(s.dim(f"  | {self.g['ellipsis']} {len(body) - 40} more lines"))
            for i, a in enumerate(p.actions, 1):
                rec = s.dim(" (recommended)") if p.recommended == a else ""
                out.append(f"  {i}) {a}{rec}")
            out.append("  or give feedback to refuse the plan")
        else:
            if inter.elicitation is not None and inter.elicitation.url:
                out.append(f"  open: {inter.elicitation.url}")
            for q in inter.questions:
                head = f"{q.header}: " if q.header else ""
                extra = []
                if q.field is not None:
                    extra.append(field_hint(q))
                    name = q.field.name
                    out.append(f"  - {head}{q.text} " + s.dim(f"[{name}: {', '.join(extra)}]"))
                else:
                    if q.multiple:
                        extra.append("several allowed")
                    if q.custom and q.choices:
                        extra.append("or type an answer")
                    note = s.dim(f" ({', '.join(extra)})") if extra else ""
                    out.append(f"  - {head}{q.text}{note}")
                for i, c in enumerate(q.choices, 1):
                    out.append(f"      {i}) {c}")
        return out

    def _on_answer(self, rec: wire.Record, a: AnswerRecord) -> None:
        self._hints_due.pop(a.interaction_id, None)
        if a.interaction_id in self._resolved:
            return
        self._resolved.add(a.interaction_id)
        self._shown_pending.discard(a.interaction_id)
        if a.auto:
            self._auto.add(a.interaction_id)
        who = " (yolo)" if a.auto else (f" by {a.by}" if a.by else "")
        asked = self._asked.get(a.interaction_id)
        title = f" ({asked.title})" if asked is not None and asked.title else ""
        # as agentctl answer says it: answered ID: WHAT
        self.line(self.style.dim(f"  {self.g['resolved']} answered {a.interaction_id}{title}: "
                                 f"{answer_summary(a.answer, asked)}{who}"))

    def _on_subagent(self, rec: wire.Record, sub: Subagent) -> None:
        self._subagents[sub.id] = sub
        prev = self._sub_status.get(sub.id)
        status = sub.status.value
        self._sub_status[sub.id] = status
        if prev == status or sub.status is SubagentStatus.IDLE:
            return
        name = sub.name or sub.id[:8]
        if sub.status is SubagentStatus.RUNNING:
            verb = "resumed" if prev == "idle" else "started"
            desc = f": {shorten(sub.description, 70, self.g['ellipsis'])}" if sub.description and prev is None else ""
            self.line(self.style.cyan(f"{self.g['sub_start']} subagent {name} {verb}{desc}"))
            return
        paint = self.style.red if sub.status is SubagentStatus.FAILED else self.style.cyan
        why = f": {sub.error}" if sub.error else ""
        self.line(paint(f"{self.g['sub_end']} subagent {name} {status}{why}"))

    def _on_todos(self, rec: wire.Record, todos: TodoList) -> None:
        self.todos(todos)

    def todos(self, todos: TodoList) -> None:
        """One line: how many are done, which are in progress (the same line is not repeated)."""
        if not todos.known or not todos.todos:
            return
        items = todos.todos
        done = sum(t.status == "done" for t in items)
        text = f"{self.g['info']} todos: {done}/{len(items)} done"
        now = [t.title for t in items if t.status == "in_progress"]
        if now:
            text += "; now: " + ", ".join(now)
        blocked = sum(t.status == "blocked" for t in items)
        if blocked:
            text += f"; {blocked} blocked"
        if text != self._todos_line:
            self._todos_line = text
            self.line(self.style.dim(shorten(text, max(20, self.width - len(self.prefix)), self.g["ellipsis"])))

    def _on_title(self, rec: wire.Record, title: str) -> None:
        if title == self._title:
            return
        self._title = title
        self.line(self.style.dim(f"{self.g['info']} title: {title}"))

    def _on_exit(self, rec: wire.Record, error: str) -> None:
        self.line(self.style.red(f"{self.g['failed']} runtime exited" + (f": {error}" if error else "")))

    def _on_error(self, rec: wire.Record, err: wire.ErrorRecord) -> None:
        self.line(self.style.red(f"{self.g['failed']} error ({err.code}): {err.message}"))

    def _on_lease(self, rec: wire.Record, lease: wire.LeaseRecord) -> None:
        if lease.action == "taken_over":
            prev = f" from {lease.previous_owner}" if lease.previous_owner else ""
            self.line(self.style.dim(f"{self.g['info']} lease taken over{prev}"))

    def _on_state(self, rec: wire.Record, st: wire.StateRecord) -> None:
        why = f": {st.reason}" if st.reason else ""
        if st.state is wire.ConversationState.CLOSED:
            self.line(self.style.dim(f"{self.g['info']} conversation closed{why}"))
        elif st.state is wire.ConversationState.ERROR:
            self.line(self.style.red(f"{self.g['failed']} conversation in error{why}"))
        elif st.state is wire.ConversationState.BUDGET_PAUSED:
            self.line(self.style.yellow(f"{self.g['notice']} paused: budget reached"
                                        f"{'' if st.reason == 'budget' else why}"))
        elif st.state is wire.ConversationState.IDLE and st.reason == "continued":
            self.line(self.style.dim(f"{self.g['info']} continued after a budget raise"))

    def _on_forked(self, rec: wire.Record, f: wire.ForkedRecord) -> None:
        self.line(self.style.dim(f"{self.g['info']} forked from {f.source} at run {f.run} (seq {f.seq})"))

    def _on_rewind(self, rec: wire.Record, r: wire.RewindRecord) -> None:
        self.line(self.style.dim(f"{self.g['info']} rewound to run {r.kept}: dropped {', '.join(r.dropped)}"))

    def _on_compaction(self, rec: wire.Record, c: Any) -> None:
        if isinstance(c, dict) and c.get("compacting"):
            self.line(self.style.dim(f"{self.g['info']} compacting context{self.g['ellipsis']}"))

    def _on_unknown(self, rec: wire.Record, u: Any) -> None:
        # A runtime kind this agentd does not know: shown, never hidden (the record keeps its data).
        self.line(self.style.dim(f"{self.g['info']} {u.provider} sent {u.type!r}, a kind agentd does not know"
                                 " (kept in the journal)"))

    def _on_model_selection(self, rec: wire.Record, m: Any) -> None:
        effort = f" ({m.effort})" if getattr(m, "effort", None) else ""
        self.line(self.style.dim(f"{self.g['info']} model: {m.model}{effort}"))

    # -------------------------------------------------------------- snapshots

    def unshown_items(self, snap: wire.Snapshot) -> list[wire.InFlightItem]:
        """The text items of ``snap`` that :meth:`snapshot` would show: not known to be journaled.

        A snapshot holds every text item of the turn in flight, the ones
        already journaled too; what the replay showed is known, but an item
        journaled before the replay started is not (see :meth:`journaled`).
        """
        out = []
        for it in snap.items:
            if it.agent_id or it.kind not in (ItemKind.ASSISTANT.value, ItemKind.REASONING.value):
                continue
            if (it.agent_id, it.id) not in self._journaled:
                out.append(it)
        return out

    def journaled(self, keys: set[tuple[str, str]]) -> None:
        """Items ((agent id, item id)) journaled before the replay started: a snapshot does not show them."""
        self._journaled |= keys

    def snapshot(self, conversation: str, snap: wire.Snapshot) -> None:
        """Show what only the snapshot holds: text still streaming when we joined, pending interactions.

        Text items already journaled are not shown again: the replay showed
        them, or they lie before where it started (:meth:`journaled`).
        It ends a replay: interactions shown during it that are still pending
        get their answer hints now (the others were answered meanwhile).
        """
        self.conversation = conversation or self.conversation
        snap = visible_all(snap)
        if self.stream_deltas:
            for it in self.unshown_items(snap):
                self.item(Item(id=it.id, kind=ItemKind(it.kind), text=it.text))
        if snap.todos is not None:
            self.todos(snap.todos)  # live-only records: a replay has not shown them
        due, self._hints_due = self._hints_due, {}
        self.replay = False
        for inter in snap.pending:
            if inter.id in due:
                if self._last_line_key != ("interaction", inter.id):
                    # other lines came since it was shown: say again which one the hints are for
                    self.line(self.style.yellow(f"{self.g['ask']} still pending: {inter.title}"))
                self.hints(inter)
            else:
                self.interaction(inter)


# ---------------------------------------------------------------------- JSON output


class JsonRecord(msgspec.Struct):
    """One line of ``--json`` stream output: a journal record plus its conversation."""

    type: str
    conversation: str
    seq: int
    ts: str
    run: str
    data: msgspec.Raw
    #: true on a turn a rewind dropped (tail/attach --all); absent otherwise
    dropped: bool | msgspec.UnsetType = msgspec.UNSET


def json_record(conversation: str, rec: wire.Record) -> bytes:
    return msgspec.json.encode(
        JsonRecord(type=rec.type, conversation=conversation, seq=rec.seq, ts=rec.ts, run=rec.run, data=rec.data,
                   dropped=True if rec.dropped else msgspec.UNSET)
    )


def json_snapshot(conversation: str, snap: wire.Snapshot) -> bytes:
    return msgspec.json.encode({"type": "snapshot", "conversation": conversation, "data": full(snap)})


# ---------------------------------------------------------------------- tables


def table(rows: list[list[str]], headers: list[str], style: Style | None = None) -> str:
    """Left-aligned columns; the last column is not padded."""
    all_rows = [headers, *([visible(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(all_rows):
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        text = "  ".join(cells).rstrip()
        lines.append(style.bold(text) if (style and n == 0) else text)
    return "\n".join(lines)


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"

