"""Terminal rendering of journal records, snapshots and results.

:class:`Renderer` turns the records of one conversation into what a person
reads: assistant text streamed as deltas arrive (reasoning dimmed), one line
per tool call and status, subagent start and finish lines, interactions as
prompts, the turn's outcome. Without colour (``NO_COLOR``, not a terminal) it
writes plain text with no ANSI sequence at all, so its output can be logged
and compared. On a terminal the live view (``live``, agentctl.liveview) adds
Markdown, a running tool's output and a spinner redrawn in place.

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
from agentd.termsafe import visible, visible_all, visible_name
from agentd.contract import (
    Answer,
    AnswerRecord,
    Delta,
    Interaction,
    InteractionKind,
    InteractionState,
    Item,
    ItemKind,
    OutputLine,
    Question,
    Subagent,
    SubagentStatus,
    TodoList,
    TokenUsage,
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
        out += [cmd("--option", o.id) for o in inter.options if not o.allow_once and not o.reject]
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
                args += ["--choice", "N|TEXT"]  # the option's own metavar: a number as listed, or the text
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
        one = "|".join(q.choices) if len(q.choices) <= 4 else "CHOICE"
    else:
        one = {"number": "NUMBER", "integer": "INTEGER", "array": "VALUE"}.get(f.type, "TEXT")
    # A multi-choice field takes several, comma-separated (or the flag repeated): not "pick one of".
    return f"{one}[,...]" if f.type == "array" else one


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
    if not f.required and len(parts) > 1 and f.type != "boolean":
        parts[-1] += " if given"  # "optional" and ">= 1 choices" side by side read as a contradiction
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
        if field is None:
            parts.append(text)
        elif text:  # an optional field left out is not shown as given empty
            parts.append(f"{field.name}={text}")
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
    same output shows answered a few lines later. ``live`` (a terminal,
    never ``--json``) turns on the live view of agentctl.liveview: text is
    printed a whole Markdown block at a time, and :meth:`refresh` redraws
    the lines under the output in place (text still arriving, running
    tools' newest output, a spinner); the outcome line of a turn adds its
    duration, tokens and cost. ``verbose`` adds who answered (pid, uid)
    and lease takeovers.
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
        live: bool = False,
        verbose: bool = False,
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
            if self.style.color or live:
                import shutil

                width = shutil.get_terminal_size((100, 24)).columns
        self.width = max(40, width)
        self.conversation = ""
        #: (model, effort) of the last model line: a confirmation of the same is not shown again
        self._model_shown: tuple[str, str | None] | None = None
        # output position
        self._mid_line = False
        self._stream_key: tuple[str, str] | None = None
        #: nothing of the streaming item printed yet (its leading newlines would be blank lines)
        self._stream_fresh = False
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
        #: a title journaled before the prompt it was made from waits for that prompt (shown once)
        self._title_due = ""
        self._title_due_tag = ""  # its --seq tag, kept for when it is shown
        #: answerers' pid and uid, lease changes
        self.verbose = verbose
        # The turn in flight (for the live region and the end-of-turn line).
        self._turn_run = ""
        self._turn_ended = False
        self._run_start: dict[str, str] = {}
        self._run_tokens: dict[str, list[float]] = {}
        self._run_cost: dict[str, float] = {}
        #: live view on a terminal (agentctl.liveview): Markdown, tool output and a spinner redrawn in place
        self.live = live
        self._region = 0  # lines of the live region on screen
        self._region_text = ""
        self._text_key: tuple[str, str] | None = None
        self._text_kind = ItemKind.ASSISTANT
        self._text_buf = ""
        self._text_blocks = 0
        self._running: dict[tuple[str, str], tuple[str, float, list[Any]]] = {}
        self._turn_since: float | None = None

    # -------------------------------------------------------------- output primitives

    def _write(self, text: str) -> None:
        if not text:
            return
        if self._region:
            self._erase_region()
        self.out.write(text)

    def flush(self) -> None:
        try:
            self.out.flush()
        except (AttributeError, ValueError):
            pass

    def end_line(self) -> None:
        """Finish a line left open by streamed text (on a terminal: print the text held, clear the live region)."""
        if self._text_key is not None:
            self._commit_text()
        if self._region:
            self._erase_region()
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
        if self.live:
            self._feed_text(key, kind, text)
            return
        if self._stream_key != key:
            self.end_line()
            self._stream_key = key
            self._stream_fresh = True
        if self._stream_fresh:
            # It starts on a line of its own already: "\n- item" after "Summary:" is no blank line.
            text = text.lstrip("\n")
            if not text:
                return
            self._stream_fresh = False
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

    # -------------------------------------------------------------- the live view (a terminal)

    def _feed_text(self, key: tuple[str, str], kind: ItemKind, text: str) -> None:
        """Hold streamed text; print what became whole blocks (Markdown) or lines (reasoning, subagents)."""
        from .liveview import commit_point

        if self._text_key != key:
            self.end_line()
            self._text_key, self._text_kind, self._text_buf, self._text_blocks = key, kind, "", 0
        self._text_buf += text
        if kind is ItemKind.ASSISTANT and not key[0]:
            cut = commit_point(self._text_buf)
        else:
            cut = self._text_buf.rfind("\n") + 1
        if cut:
            chunk, self._text_buf = self._text_buf[:cut], self._text_buf[cut:]
            self._print_text(key, kind, chunk)
        self._last_line_key = None

    def _commit_text(self) -> None:
        """Print all the text held (its item is whole, or another line comes)."""
        key, self._text_key = self._text_key, None
        chunk, self._text_buf = self._text_buf, ""
        if key is not None and chunk.strip():
            self._print_text(key, self._text_kind, chunk)

    def _print_text(self, key: tuple[str, str], kind: ItemKind, chunk: str) -> None:
        lead = self.style.cyan(f"[{self._agent_name(key[0])}] ") if key[0] else ""
        if kind is ItemKind.ASSISTANT and not key[0]:
            if not chunk.strip():
                return
            from .liveview import markdown

            lines = markdown(chunk, max(20, self.width - len(self.prefix) - 1), self.style.color)
            if self._text_blocks:
                lines.insert(0, "")
            self._text_blocks += 1
            paint = str
        else:
            lines = chunk.rstrip("\n").split("\n")
            if kind is ItemKind.REASONING:
                lead += self.style.dim(self.g["reasoning"])
                paint = self.style.italic_dim
            else:
                paint = str
        for ln in lines:
            self._write(f"{self.prefix}{self._take_seq_tag()}{lead}{paint(ln)}\n")
        self._mid_line = False
        self._at_line_start = True

    def _erase_region(self) -> None:
        n, self._region, self._region_text = self._region, 0, ""
        self.out.write("\r\x1b[2K" + "\x1b[1A\x1b[2K" * (n - 1))

    def refresh(self) -> None:
        """Redraw the live region: text still streaming, running tools' newest output, a spinner.

        Only on a terminal (``live``), after a replay, at the start of a line.
        """
        if not self.live or self.replay or self._mid_line:
            return
        import shutil
        import time

        from .liveview import SPINNER, SPINNER_ASCII, TEXT_TAIL_LINES, TOOL_TAIL_LINES, fit, rows

        now = time.monotonic()
        self.width = max(40, shutil.get_terminal_size((self.width, 24)).columns)  # the window may have changed
        room = max(20, self.width - len(self.prefix) - 1)
        lines: list[str] = []
        if self._text_key is not None and self._text_buf.strip():
            reasoning = self._text_kind is ItemKind.REASONING
            lead = self.g["reasoning"] if reasoning else ""
            for shown in rows(lead + self._text_buf, room, TEXT_TAIL_LINES):
                lines.append(self.style.italic_dim(shown) if reasoning else shown)
        several = len([1 for v in self._running.values() if v[2]]) > 1
        for name, _, tail in self._running.values():
            if not tail:
                continue
            if several:
                lines.append(self.style.dim(fit(f"  {name}:", room)))
            for ol in tail[-TOOL_TAIL_LINES:]:
                text = fit("  │ " + ol.text, room)
                lines.append(self.style.red(text) if ol.err else self.style.dim(text))
        if self._turn_run and not self._shown_pending and not self._hints_due:
            frames = SPINNER if self.g is _GLYPHS_UNICODE else SPINNER_ASCII
            frame = frames[int(now * 10) % len(frames)]
            if self._running:
                name, since, _ = list(self._running.values())[-1]
                label = f"{name} running · {duration(now - since)}"
            else:
                label = f"working · {duration(now - (self._turn_since or now))}"
            lines.append(self.style.cyan(frame) + " " + self.style.dim(fit(label, room - 2)))
        text = "\n".join(self.prefix + ln for ln in lines)
        if text == self._region_text and self._region:
            return
        if self._region:
            self._erase_region()
        if lines:
            self.out.write(text)
            self._region, self._region_text = len(lines), text
        self.flush()

    def _turn_begins(self, run: str, ts: str) -> None:
        if not run:
            return
        if ts:
            self._run_start.setdefault(run, ts)
        if self._turn_run != run:
            import datetime as dt
            import time

            age = 0.0
            try:  # the spinner counts from the turn's start, also when we joined late (attach)
                age = (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(ts)).total_seconds() if ts else 0.0
            except (ValueError, TypeError):
                pass
            self._turn_run, self._turn_ended = run, False
            self._turn_since = time.monotonic() - max(0.0, age)

    def _turn_summary(self, run: str, ts: str) -> str:
        """`` · 8s · 5,580 tokens (5,200 in, 380 out) · $0.0123`` for the turn ``run`` that ended at ``ts``."""
        import datetime as dt

        bits = []
        start = self._run_start.get(run)
        if start:
            try:
                secs = (dt.datetime.fromisoformat(ts) - dt.datetime.fromisoformat(start)).total_seconds()
            except ValueError:
                secs = -1.0
            if secs >= 0:
                bits.append(f"{secs:.1f}s" if secs < 60 else duration(secs))
        tok = self._run_tokens.get(run)
        if tok is not None:
            inp, out = int(tok[0]), int(tok[1])
            bits.append(f"{inp + out:,} tokens ({inp:,} in, {out:,} out)")
        cost = self._run_cost.get(run)
        if cost is not None:
            bits.append(f"${cost:.4f}" if cost < 1 else f"${cost:.2f}")
        return "".join(f" · {b}" for b in bits)

    def _on_tokens(self, rec: wire.Record, t: TokenUsage) -> None:
        if not rec.run or not isinstance(t, TokenUsage):
            return
        tok = self._run_tokens.setdefault(rec.run, [0, 0])
        tok[0] += t.input
        tok[1] += t.output
        if t.cost_usd is not None:
            self._run_cost[rec.run] = self._run_cost.get(rec.run, 0.0) + t.cost_usd

    def know_subagents(self, subagents: "list[Subagent]") -> None:
        """Name these subagents' items by their names (what the live view learned from their records)."""
        for sub in subagents:
            self._subagents.setdefault(sub.id, visible_all(sub))  # runtime text, like every record

    def _agent_name(self, agent_id: str) -> str:
        s = self._subagents.get(agent_id)
        return s.name if s and s.name else _short_id(agent_id)

    # -------------------------------------------------------------- records

    def record(self, conversation: str, rec: wire.Record) -> None:
        """Render one journal (or live) record of ``conversation``."""
        self.conversation = conversation or self.conversation
        if self._title_due and rec.type != "prompt":
            self._show_title()
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
        entry = visible_all(entry)  # runtime text, like every record
        if self.show_seq and entry.seq:
            self._seq_tag = self.style.dim(f"#{entry.seq}") + " "
        if entry.imported:  # one of an adopted session's earlier turns (agentctl import)
            self._seq_tag += self.style.dim("[imported]") + " "
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

    def _on_revert(self, rec: wire.Record, r: wire.RevertRecord) -> None:
        """A ``revert`` record (a step of its own, agentd.checkpoints): what it undid, how to undo it."""
        count = f"{len(r.files)} file{'s' if len(r.files) != 1 else ''}"
        self.line(self.style.dim(f"{self.g['info']} reverted {r.of}: {count} "
                                 f"(undo: agentctl revert {self.conversation} --run {r.id})"))

    def _on_import(self, rec: wire.Record, i: wire.ImportRecord) -> None:
        past = f"{i.items} earlier item(s) follow" if i.history else "the runtime cannot show its earlier turns"
        forced = ", adopted with --force while in use" if i.forced else ""
        self.line(self.style.dim(f"{self.g['info']} adopted {i.provider} session {i.session} ({past}{forced})"))

    def _on_prompt(self, rec: wire.Record, p: wire.PromptRecord) -> None:
        if self._title_due:
            # agentd titled the conversation from this very prompt: the prompt line says it already
            first = " ".join(next((ln for ln in p.text.splitlines() if ln.strip()), "").split())
            if first.startswith(self._title_due.rstrip("…")):
                self._title_due = ""
            else:
                self._show_title()
        if p.disposition in ("", "started"):
            self._turn_begins(rec.run, rec.ts)
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
                if self._text_key == key:
                    self._commit_text()  # the item is whole: what was held is printed
                return  # nothing new (an older view of the same text)
            if text.startswith(done):
                rest = text[len(done):]
            else:
                rest = text
                self.end_line()
            if rest:
                self._stream(key, item.kind, rest)
            if self._text_key == key:
                self._commit_text()
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
        if self.live:
            if status == "running":
                import time

                since = self._running[key][1] if key in self._running else time.monotonic()
                tail = list(t.tail)
                if not tail and t.output:  # a runtime that updates the output itself (ACP agents)
                    tail = [OutputLine(text=ln) for ln in t.output.splitlines()[-10:] if ln.strip()]
                self._running[key] = (t.name, since, tail)
            else:
                self._running.pop(key, None)
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
        if status != "running" and t.cut and self.conversation:
            # The item id is shown nowhere else: say how to read what the journal cut.
            indent = " " * (len(self.g["tool_ok"]) + 1)
            agent = f" --agent {item.agent_id}" if item.agent_id else ""
            self.line(lead + self.style.dim(f"{indent}({t.cut:,} bytes of its output cut; all of it: "
                                            f"agentctl show {self.conversation} --item {item.id}{agent} --full)"))

    def _on_delta(self, rec: wire.Record, d: Delta) -> None:
        self.delta(d)

    def delta(self, d: Delta) -> None:
        if not self.stream_deltas or d.agent_id or d.kind not in (ItemKind.ASSISTANT, ItemKind.REASONING):
            return
        key = (d.agent_id, d.item_id)
        self._stream(key, d.kind, d.text)
        self._printed[key] = self._printed.get(key, "") + d.text

    def _on_turn(self, rec: wire.Record, turn: Turn) -> None:
        if turn.state is TurnState.WORKING:
            self._turn_begins(rec.run, rec.ts)
            return
        # On a terminal the outcome line also says how long the turn took and what it cost.
        summary = self._turn_summary(rec.run, rec.ts) if self.live and rec.run else ""
        if rec.run and rec.run == self._turn_run:
            self._turn_run, self._turn_since = "", None
        self._running.clear()
        self._turn_ended = True
        self.turn(turn, summary=summary)

    def turn(self, turn: Turn, *, summary: str = "") -> None:
        """The outcome line of an ended turn; ``summary`` (`` · 8s · ...``) is added to it, dimmed."""
        if turn.state is TurnState.WORKING:
            return
        self.end_line()
        tail = self.style.dim(summary) if summary else ""
        if turn.state is TurnState.COMPLETED:
            self.line(self.style.green(f"{self.g['ok']} turn completed") + tail)
        elif turn.state is TurnState.CANCELLED:
            why = f": {turn.error}" if turn.reason in ("budget", "cancel_timeout") and turn.error else ""
            self.line(self.style.yellow(f"{self.g['cancelled']} turn cancelled{why}") + tail)
        else:
            why = turn.error or turn.reason
            self.line(self.style.red(f"{self.g['failed']} turn failed" + (f": {why}" if why else "")) + tail)
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
        who = " (yolo)" if a.auto else (f" by {a.by}" if a.by and self.verbose else "")
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
        name = sub.name or _short_id(sub.id)
        if sub.status is SubagentStatus.RUNNING:
            verb = "resumed" if prev == "idle" else "started"
            desc = f": {shorten(sub.description, 70, self.g['ellipsis'])}" if sub.description and prev is None else ""
            self.line(self.style.cyan(f"{self.g['sub_start']} subagent {name} {verb}{desc}"))
            return
        paint = self.style.red if sub.status is SubagentStatus.FAILED else self.style.cyan
        why = f": {sub.error}" if sub.error else ""
        self.line(paint(f"{self.g['sub_end']} subagent {name} {status}{why}"))

    def _on_todos(self, rec: wire.Record, todos: TodoList) -> None:
        if self._turn_ended and not self._turn_run:
            return  # a late report of a turn that ended: its list is no news
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
        if not rec.run:
            self._title_due = title  # maybe made from the prompt that follows (see _on_prompt)
            self._title_due_tag = self._seq_tag
            return
        self.line(self.style.dim(f"{self.g['info']} title: {title}"))

    def _show_title(self) -> None:
        title, self._title_due = self._title_due, ""
        # Shown late (before the next record, or by its prompt's handler): with its own seq tag.
        held, self._seq_tag = self._seq_tag, self._title_due_tag
        try:
            self.line(self.style.dim(f"{self.g['info']} title: {title}"))
        finally:
            self._seq_tag = held

    def settle(self) -> None:
        """The stream went quiet: print a title held for the prompt that would follow it."""
        if self._title_due:
            self._show_title()

    def _on_exit(self, rec: wire.Record, error: str) -> None:
        self.line(self.style.red(f"{self.g['failed']} runtime exited" + (f": {error}" if error else "")))

    def _on_error(self, rec: wire.Record, err: wire.ErrorRecord) -> None:
        self.line(self.style.red(f"{self.g['failed']} error ({err.code}): {err.message}"))

    def _on_lease(self, rec: wire.Record, lease: wire.LeaseRecord) -> None:
        if lease.action == "taken_over" and self.verbose:
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
        shown = (m.model, getattr(m, "effort", None))
        if getattr(m, "source", "") == "user":
            when = ", from the next turn" if getattr(m, "queued", False) else ""
            self.line(self.style.dim(f"{self.g['info']} model set to {m.model}{effort}{when}"))
        elif shown != self._model_shown:  # the runtime's confirmation of what was just set says nothing new
            self.line(self.style.dim(f"{self.g['info']} model: {m.model}{effort}"))
        self._model_shown = shown

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
        self.settle()
        snap = visible_all(snap)
        if self.stream_deltas:
            for it in self.unshown_items(snap):
                self.item(Item(id=it.id, kind=ItemKind(it.kind), text=it.text))
        if snap.todos is not None and snap.state in (wire.ConversationState.RUNNING,
                                                     wire.ConversationState.REQUIRES_ACTION):
            self.todos(snap.todos)  # live-only records: a replay has not shown them (and only while a turn runs)
        if snap.run and snap.state in (wire.ConversationState.RUNNING, wire.ConversationState.REQUIRES_ACTION):
            self._turn_begins(snap.run, "")
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
    """Left-aligned columns; the last column is not padded. A cell is one line whatever it holds
    (:func:`~agentd.termsafe.visible_name`: a newline in a title or name forges no row)."""
    all_rows = [headers, *([visible_name(c) for c in r] for r in rows)]
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


def _short_id(agent_id: str) -> str:
    """A subagent's id where its name is not known (a history page holds items only): whole up to
    16 characters (the demo's ``agent-1-16`` read ``agent-1-`` cut at 8), else cut, visibly."""
    return agent_id if len(agent_id) <= 16 else agent_id[:12] + "…"
