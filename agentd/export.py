"""Transcripts rendered from a conversation's journal: Markdown, JSON, or one self-contained HTML file.

Pure functions: :func:`transcript` folds journal records into an ordered list
of :class:`Entry` values (an item updated many times appears once, at its
first position, with its last content), and :func:`render` writes them out.
The user's messages come from the daemon's ``prompt`` records (with their
attachments), everything else from the provider's items and interactions.

By default a transcript holds what was said: prompts, answers, questions with
their answers, plan reviews, notices and how turns that did not complete
ended. A question asking several things at once (a form) keeps each field
with its answer (:class:`FieldAnswer`), rendered one list item per field. ``include_tools`` adds tool calls with their input and output,
permission requests, reasoning, and subagents' items.

Markdown and HTML show control characters in conversation text visibly
(``\x1b``; agentd.termsafe), so printing an export to a terminal is safe.
The HTML is one file with inline CSS and no script, image, font or link to
anything outside it (a Content-Security-Policy says so too); every piece of
conversation text is escaped. The agent's own text (answers, reasoning, plans)
is Markdown and is rendered as such with markdown-it-py (CommonMark, tables,
strikethrough; imported on the first HTML export): HTML the agent wrote stays
escaped text, a link shows its address instead of linking, an image is not
loaded, code is monospace.
"""

from __future__ import annotations

import datetime as _dt
import html
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Literal

import msgspec

from . import contract as c
from . import masking, wire
from .termsafe import visible

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

__all__ = ["Entry", "FieldAnswer", "Transcript", "FORMATS", "render", "transcript"]

Format = Literal["md", "json", "html"]
FORMATS: tuple[str, ...] = ("md", "json", "html")


class FieldAnswer(msgspec.Struct, omit_defaults=True):
    """One field of a form (or one of several questions) and what was answered to it.

    ``value`` is None while nothing was answered (pending, declined, dismissed),
    "" for a field left empty in an answer.
    """

    label: str
    value: str | None = None


class Entry(msgspec.Struct, omit_defaults=True):
    """One transcript entry. ``role``: user, assistant, reasoning, tool, notice, question, permission, plan, turn."""

    role: str
    text: str = ""
    time: str = ""
    run: str = ""
    agent_id: str = ""
    attachments: list[c.Attachment] = []
    tool: c.ToolCall | None = None
    #: questions and plan reviews: what was asked; the answer is in ``answer``
    title: str = ""
    answer: str = ""
    #: questions asking several things at once (a form): each field with its answer, in order
    fields: list[FieldAnswer] = []
    #: turn entries: completed, failed, cancelled; user entries: how the prompt was taken
    state: str = ""
    reason: str = ""


class Meta(msgspec.Struct, omit_defaults=True):
    id: str
    title: str = ""
    provider: str = ""
    workdir: str = ""
    model: str = ""
    created_at: str = ""
    updated_at: str = ""
    state: str = ""


class Transcript(msgspec.Struct, kw_only=True):
    """The JSON export: every top-level key present; entries leave out what they do not have."""

    format: str = "agentd-transcript"
    version: int = 1
    conversation: Meta
    usage: c.Usage | None = None
    entries: list[Entry] = []


def _time(value: _dt.datetime | None, fallback: str) -> str:
    """``value`` as ``YYYY-MM-DDTHH:MM:SSZ``; None: ``fallback`` (a journal ts) to the same second precision."""
    if value is None:
        return _seconds(fallback)
    try:
        return value.astimezone(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, ValueError):  # a runtime's time at the edge of datetime's range has no UTC value
        return _seconds(fallback)


def _seconds(ts: str) -> str:
    """A journal ts (``2024-05-01T12:00:00.123Z``) without its milliseconds, like every other time here."""
    head, dot, _ = ts.partition(".")
    return head + "Z" if dot else ts


def _answer_text(inter: c.Interaction, rec: c.AnswerRecord) -> str:
    a = rec.answer
    who = " (automatic)" if rec.auto else ""
    if inter.kind is c.InteractionKind.PERMISSION:
        label = next((o.label for o in inter.options if o.id == a.decision), a.decision)
        return label + who
    if inter.kind is c.InteractionKind.PLAN_REVIEW:
        if a.plan is None:
            return ""
        return (f"approved: {a.plan.action}" if a.plan.action else f"feedback: {a.plan.feedback}") + who
    if a.reject:
        return "declined" + who
    if a.cancel:
        return "dismissed" + who
    parts = []
    for q, values in zip(inter.questions, a.answers):
        shown = _shown(values) or "-"
        parts.append(f"{q.text}: {shown}" if len(inter.questions) > 1 else shown)
    return "; ".join(parts) + who


def _shown(values: list[str]) -> str:
    return ", ".join(v for v in values if v)


def _fields(inter: c.Interaction, rec: c.AnswerRecord | None = None) -> list[FieldAnswer]:
    """The fields of an interaction asking several things at once, with the answer's values if it gave them."""
    if len(inter.questions) < 2:
        return []
    given: list[list[str]] | None = None
    if rec is not None and not (rec.answer.reject or rec.answer.cancel) and rec.answer.answers:
        given = rec.answer.answers
    out = []
    for i, q in enumerate(inter.questions):
        value = None if given is None else _shown(given[i] if i < len(given) else [])
        out.append(FieldAnswer(label=q.text, value=value))
    return out


def transcript(record: wire.ConversationRecord, lines: Iterable[bytes], *, include_tools: bool = False,
               whole_output: "Callable[[str, str], str | None] | None" = None) -> Transcript:
    """Fold journal ``lines`` (oldest first) into a :class:`Transcript`.

    ``whole_output(agent_id, item_id)`` gives the kept whole output of a tool item
    whose record holds a display cut (agentd.tool_outputs); the export shows that.

    Raises msgspec errors only for lines that are not records; a record
    whose payload does not decode is skipped. Secrets (agentd.masking) are
    masked in every line and in the record, whatever the journal holds.
    """
    record = masking.mask_struct(record)
    meta = Meta(id=record.id, title=record.title, provider=record.provider, workdir=record.workdir,
                model=record.model, created_at=record.created_at, updated_at=record.updated_at,
                state=record.state.value)
    entries: list[Entry] = []
    items: dict[tuple[str, str], int] = {}
    interactions: dict[str, tuple[int, c.Interaction]] = {}
    usage: c.Usage | None = record.usage
    for line in lines:
        rec = wire.decode_record(masking.mask_json(line))
        try:
            payload = wire.decode_payload(rec)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        t = rec.type
        if t == "conversation":
            meta.model = meta.model or payload.model
        elif t == "prompt":
            p: wire.PromptRecord = payload
            entries.append(Entry(role="user", text=p.text, time=_seconds(rec.ts), run=rec.run,
                                 attachments=list(getattr(p, "attachments", []) or []),
                                 state="dropped" if rec.dropped else "" if p.disposition in ("", "started") else p.disposition))
        elif t == "item":
            item: c.Item = payload
            imported = not rec.run and item.id.startswith("import.")  # an adopted session's past (agentd.adopt)
            if item.kind is c.ItemKind.USER and not item.agent_id and not imported:
                continue  # the prompt record says it, with its attachments
            if not include_tools and (item.agent_id or item.kind in (c.ItemKind.TOOL, c.ItemKind.REASONING)):
                continue
            if item.kind is c.ItemKind.USER:
                role = "user"
            else:
                role = item.kind.value
            tool = item.tool
            if tool is not None and tool.cut and whole_output is not None:
                whole = whole_output(item.agent_id, item.id)
                if whole is not None:
                    tool = msgspec.structs.replace(tool, output=whole, cut=0)
            entry = Entry(role=role, text=item.text, time=_time(item.time, rec.ts), run=rec.run,
                          agent_id=item.agent_id, tool=tool, attachments=list(item.attachments))
            key = (item.agent_id, item.id)
            if key in items:
                old = entries[items[key]]
                entry.time = old.time or entry.time
                entries[items[key]] = entry
            else:
                items[key] = len(entries)
                entries.append(entry)
        elif t == "interaction":
            inter: c.Interaction = payload
            if inter.kind is c.InteractionKind.PERMISSION and not include_tools:
                continue
            role = {"permission": "permission", "question": "question", "plan_review": "plan"}[inter.kind.value]
            if inter.kind is c.InteractionKind.QUESTION:
                text = "\n".join(q.text for q in inter.questions) or inter.detail
            elif inter.kind is c.InteractionKind.PLAN_REVIEW and inter.plan is not None:
                text = inter.plan.content or inter.plan.summary
            else:
                text = inter.detail
            if inter.id in interactions:
                idx, _old = interactions[inter.id]
                entries[idx].state = inter.state.value
                if not entries[idx].answer and inter.state is not c.InteractionState.PENDING and inter.resolution:
                    entries[idx].reason = inter.resolution
                interactions[inter.id] = (idx, inter)
            else:
                interactions[inter.id] = (len(entries), inter)
                entries.append(Entry(role=role, title=inter.title, text=text, time=_time(inter.time, rec.ts),
                                     run=rec.run, agent_id=inter.agent_id, state=inter.state.value,
                                     fields=_fields(inter)))
        elif t == "answer":
            ans: c.AnswerRecord = payload
            found = interactions.get(ans.interaction_id)
            if found is not None:
                idx, inter = found
                entries[idx].answer = _answer_text(inter, ans)
                entries[idx].fields = _fields(inter, ans)
        elif t == "turn":
            turn: c.Turn = payload
            if turn.state in (c.TurnState.FAILED, c.TurnState.CANCELLED):
                entries.append(Entry(role="turn", state=turn.state.value, text=turn.error, reason=turn.reason,
                                     time=_seconds(rec.ts), run=rec.run))
        elif t == "title":
            meta.title = payload or meta.title
        elif t == "usage":
            usage = payload
        elif t == "state":
            st: wire.StateRecord = payload
            if st.state in (wire.ConversationState.CLOSED, wire.ConversationState.BUDGET_PAUSED):
                what = "closed" if st.state is wire.ConversationState.CLOSED else "paused: budget reached"
                entries.append(Entry(role="notice", text=f"conversation {what}" + (f" ({st.reason})" if st.reason else ""),
                                     time=_seconds(rec.ts)))
    meta.title = record.title or meta.title
    return Transcript(conversation=meta, entries=entries, usage=usage)


def render(t: Transcript, fmt: str) -> str:
    """``t`` as ``md``, ``json`` or ``html`` text; :class:`~agentd.contract.Invalid` for another format."""
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(t), indent=2).decode() + "\n"
    if fmt == "md":
        return visible(_markdown(t))
    if fmt == "html":
        return visible(_html(t))
    raise c.Invalid(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)}")


# --------------------------------------------------------------------------- shared wording


def _title(t: Transcript) -> str:
    return t.conversation.title or f"Conversation {t.conversation.id}"


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def _usage_line(u: c.Usage | None) -> str:
    if u is None:
        return ""
    bits = [f"{u.input_tokens:,} input tokens", f"{u.output_tokens:,} output"]
    if u.cached_tokens:
        bits.append(f"{u.cached_tokens:,} cached")
    if u.cost_usd is not None:
        bits.append(f"{'~' if u.estimated else ''}${u.cost_usd:.4f}")
    if u.ai_units:
        bits.append(f"{u.ai_units:g} AI units")
    return ", ".join(bits)


_LABEL = {
    "user": "You",
    "assistant": "Assistant",
    "reasoning": "Reasoning",
    "tool": "Tool",
    "notice": "Notice",
    "question": "Question",
    "permission": "Permission",
    "plan": "Plan review",
    "turn": "Turn",
}


def _heading(e: Entry) -> str:
    label = _LABEL.get(e.role, e.role)
    if e.agent_id:
        label += f" [{e.agent_id}]"
    if e.role == "tool" and e.tool is not None:
        label += f": {e.tool.name}"
    if e.role == "user" and e.state:
        label += f" ({e.state})"
    if e.role == "turn":
        label = f"Turn {e.state}" + (f" ({e.reason})" if e.reason else "")
    return label


def _field_label(label: str) -> str:
    """A field's label on one line, ending with a colon unless it ends with punctuation of its own."""
    label = " ".join(label.split())
    return label if label.endswith((":", "?", "!", ".")) else label + ":"


def _fields_answered(e: Entry) -> bool:
    return any(f.value is not None for f in e.fields)


def _tool_status(tool: c.ToolCall) -> str:
    s = tool.status.value
    if tool.exit_code is not None:
        s += f", exit {tool.exit_code}"
    return s


# --------------------------------------------------------------------------- Markdown


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"( {0,3})(#{1,6})(?=[ \t]|$)")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_BACKTICKS = re.compile(r"`+")


def _code_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each code span on the line, in order: a run of n backticks up to the next
    run of exactly n (CommonMark); a run no later one closes is text. Linear in the line's length:
    each run is looked at once (a regex that tried every closer for every opener took seconds on
    a line of unclosed runs, an agent's text holding up every export)."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(text)]
    later: dict[int, deque[int]] = {}  # run length -> indexes of the runs of that length, in order
    for i, (start, end) in enumerate(runs):
        later.setdefault(end - start, deque()).append(i)
    i = 0
    while i < len(runs):
        start, end = runs[i]
        same = later[end - start]
        while same and same[0] <= i:  # runs at or before this one (or inside a span taken) close nothing
            same.popleft()
        if not same:
            i += 1
            continue
        j = same.popleft()
        yield start, runs[j][1]
        i = j + 1


def _md_inline(text: str) -> str:
    """Untrusted text on a line of the Markdown export, outside code spans: raw HTML shown as text
    (``<`` as ``&lt;``) and an image made a link (``!`` escaped), so a viewer loads nothing."""
    out, pos = [], 0
    for start, end in _code_spans(text) if "`" in text else ():
        out.append(text[pos:start].replace("<", "&lt;").replace("![", "\\!["))
        out.append(text[start:end])  # a code span: as written
        pos = end
    out.append(text[pos:].replace("<", "&lt;").replace("![", "\\!["))
    return "".join(out)


def _md_text(text: str) -> str:
    """An entry's untrusted Markdown (the agent's, a runtime's transcript) as the Markdown export
    holds it: its headings three levels down, under the export's own ``###`` entry headings (as the
    HTML export demotes them), a setext underline shown as text, raw HTML as text and images as
    links (:func:`_md_inline`); fenced code as written. An agent cannot forge an entry heading."""
    out: list[str] = []
    fence = ""
    previous = ""
    for line in text.split("\n"):
        if fence:
            out.append(line)
            m = _FENCE.match(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end():].strip():
                fence = ""
            previous = ""
            continue
        m = _FENCE.match(line)
        if m:
            fence = m.group(1)
            out.append(line)
            previous = ""
            continue
        if line.startswith(("    ", "\t")) and not previous.strip():
            out.append(line)  # indented code
            continue
        atx = _ATX.match(line)
        if atx:
            line = atx.group(1) + "#" * min(6, len(atx.group(2)) + 3) + _md_inline(line[atx.end():])
        elif previous.strip() and _SETEXT.match(line):
            line = "\\" + line.lstrip()  # not an underline: a heading of the agent's own
        else:
            line = _md_inline(line)
        out.append(line)
        previous = line
    return "\n".join(out)


def _fence(text: str, info: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip(chr(10))}\n{ticks}"


def _md_field(f: FieldAnswer, *, answered: bool) -> str:
    """``- **Label:** value``; a value's further lines are indented to stay in the list item."""
    if not answered:
        return f"- {_md_inline(' '.join(f.label.split()))}"
    first, *rest = _md_inline((f.value or "").strip("\n")).split("\n")
    value = "\n".join([first or "—"] + [f"  {line}" if line.strip() else "" for line in rest])
    return f"- **{_md_inline(_field_label(f.label))}** {value}"


def _markdown(t: Transcript) -> str:
    m = t.conversation
    out = [f"# {_md_inline(_title(t))}", ""]
    facts = [f"- Conversation: `{m.id}` ({m.provider}" + (f", model {m.model}" if m.model else "") + ")"]
    if m.workdir:
        facts.append(f"- Working directory: `{m.workdir}`")
    if m.created_at:
        facts.append(f"- Created: {m.created_at}")
    usage = _usage_line(t.usage)
    if usage:
        facts.append(f"- Usage: {usage}")
    out += facts + ["", "---", ""]
    for e in t.entries:
        when = f" · {e.time}" if e.time else ""
        out.append(f"### {_md_inline(_heading(e))}{when}")
        out.append("")
        if e.role == "tool" and e.tool is not None:
            tool = e.tool
            out.append(f"*{_md_inline(tool.title or tool.name)}* — {_tool_status(tool)}")
            out.append("")
            if tool.input:
                out += [_fence(tool.input), ""]
            if tool.output:
                out += [_fence(tool.output), ""]
            continue
        if e.title and e.role in ("question", "permission", "plan"):
            out += [f"**{_md_inline(e.title)}**", ""]
        if e.fields:
            # One list item per field (its text is the labels, one a line, which Markdown would run together).
            out += [_md_field(f, answered=_fields_answered(e)) for f in e.fields] + [""]
        elif e.text:
            out += [_md_text(e.text.rstrip("\n")), ""]
        if e.attachments:
            out.append("Attachments:")
            out += [f"- `{a.name}` ({a.mime}, {_size(a.size)})" for a in e.attachments]
            out.append("")
        if e.answer and not _fields_answered(e):
            out += [f"> **Answer:** {_md_inline(e.answer)}", ""]
        elif e.role in ("question", "permission", "plan") and e.state and e.state != "answered":
            out += [f"> *{e.state}*" + (f" ({e.reason})" if e.reason else ""), ""]
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- HTML

_CSS = """
:root { color-scheme: light dark; --fg: #1f2328; --bg: #ffffff; --muted: #656d76; --line: #d0d7de;
  --user: #ddf4ff; --assistant: #f6f8fa; --tool: #fff8c5; --notice: #ffebe9; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #8d96a0; --line: #30363d;
  --user: #0c2d48; --assistant: #161b22; --tool: #2e2a10; --notice: #3c1618; } }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 52rem; padding: 1.5rem; color: var(--fg); background: var(--bg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 1.5rem; margin: 0 0 .5rem; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; color: var(--muted); margin: 0 0 1.5rem; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.entry { border: 1px solid var(--line); border-radius: 8px; padding: .6rem .9rem; margin: 0 0 .8rem; background: var(--assistant); }
.entry.user { background: var(--user); }
.entry.tool, .entry.permission { background: var(--tool); }
.entry.turn, .entry.notice { background: var(--notice); }
.head { font-size: .85rem; color: var(--muted); margin-bottom: .3rem; display: flex; justify-content: space-between; gap: 1rem; }
.head .who { font-weight: 600; color: var(--fg); }
.text { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; font: inherit; }
.md > :first-child { margin-top: 0; } .md > :last-child { margin-bottom: 0; }
.md h3, .md h4, .md h5, .md h6 { margin: .8rem 0 .3rem; }
.md pre, .md code { font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.md pre { white-space: pre-wrap; overflow-wrap: anywhere; background: var(--bg); border: 1px solid var(--line);
  border-radius: 6px; padding: .5rem; }
.md code { background: var(--bg); border-radius: 4px; padding: 0 .2em; } .md pre code { padding: 0; background: none; }
.md table { border-collapse: collapse; } .md th, .md td { border: 1px solid var(--line); padding: .2rem .5rem; }
.md blockquote { margin: 0; padding-left: .8rem; border-left: 3px solid var(--line); color: var(--muted); }
.md .url { color: var(--muted); overflow-wrap: anywhere; }
pre.code { white-space: pre-wrap; overflow-wrap: anywhere; background: var(--bg); border: 1px solid var(--line);
  border-radius: 6px; padding: .5rem; font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.answer { margin-top: .4rem; font-weight: 600; }
ul.fields { margin: .4rem 0 0; padding-left: 1.2rem; }
ul.fields .value { white-space: pre-wrap; overflow-wrap: anywhere; }
ul.files { margin: .4rem 0 0; padding-left: 1.2rem; font-size: .9rem; }
details summary { cursor: pointer; }
footer { color: var(--muted); font-size: .8rem; margin-top: 2rem; }
@media print { .entry { break-inside: avoid; } }
"""


def _h(text: str) -> str:
    return html.escape(text, quote=True)


#: entries whose text is the agent's own Markdown
_MARKDOWN_ROLES = ("assistant", "reasoning", "plan")
_md_parser = None


def _md() -> "MarkdownIt":
    """The Markdown renderer of the HTML export, built on first use (see the module docstring)."""
    global _md_parser
    if _md_parser is None:
        from markdown_it import MarkdownIt

        md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
        md.enable(["table", "strikethrough"]).disable(["image"])

        def link_open(self: object, tokens: list, idx: int, options: object, env: dict) -> str:
            env.setdefault("hrefs", []).append(tokens[idx].attrGet("href") or "")
            return '<span class="link">'

        def link_close(self: object, tokens: list, idx: int, options: object, env: dict) -> str:
            href = env["hrefs"].pop() if env.get("hrefs") else ""
            return "</span>" + (f' <span class="url">&lt;{_h(str(href))}&gt;</span>' if href else "")

        def tidy(state: object) -> None:
            # The agent's headings sit under the page's h1 and each entry's heading; no inline styles.
            for tok in state.tokens:  # type: ignore[attr-defined]
                if tok.type in ("heading_open", "heading_close"):
                    tok.tag = f"h{min(6, int(tok.tag[1]) + 2)}"
                if tok.attrs:
                    tok.attrs.pop("style", None)

        md.add_render_rule("link_open", link_open)
        md.add_render_rule("link_close", link_close)
        md.core.ruler.push("agentd_tidy", tidy)
        _md_parser = md
    return _md_parser


def _markdown_html(text: str) -> str:
    """Agent Markdown as HTML: every piece of its text escaped (``'`` too), no link, no image."""
    return _md().render(text, {}).replace("'", "&#x27;").rstrip("\n")


def _html(t: Transcript) -> str:
    m = t.conversation
    title = _title(t)
    meta_rows = [("Conversation", m.id), ("Provider", m.provider + (f" (model {m.model})" if m.model else ""))]
    if m.workdir:
        meta_rows.append(("Working directory", m.workdir))
    if m.created_at:
        meta_rows.append(("Created", m.created_at))
    usage = _usage_line(t.usage)
    if usage:
        meta_rows.append(("Usage", usage))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="agentd">',
        f"<title>{_h(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<main>",
        f"<h1>{_h(title)}</h1>",
        '<dl class="meta">' + "".join(f"<dt>{_h(k)}</dt><dd>{_h(v)}</dd>" for k, v in meta_rows) + "</dl>",
    ]
    for e in t.entries:
        parts.append(_html_entry(e))
    parts += [
        "</main>",
        f"<footer>Exported by agentd from the journal of conversation {_h(m.id)}.</footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def _html_entry(e: Entry) -> str:
    head = (f'<div class="head"><span class="who">{_h(_heading(e))}</span>'
            f'<time>{_h(e.time)}</time></div>')
    body: list[str] = []
    if e.role == "tool" and e.tool is not None:
        tool = e.tool
        body.append(f'<details><summary>{_h(tool.title or tool.name)} — {_h(_tool_status(tool))}</summary>')
        if tool.input:
            body.append(f'<pre class="code">{_h(tool.input)}</pre>')
        if tool.output:
            body.append(f'<pre class="code">{_h(tool.output)}</pre>')
        body.append("</details>")
    else:
        if e.title and e.role in ("question", "permission", "plan"):
            body.append(f"<p><strong>{_h(e.title)}</strong></p>")
        if e.fields:
            answered = _fields_answered(e)
            items = "".join(
                f"<li><strong>{_h(_field_label(f.label))}</strong> "
                f'<span class="value">{_h((f.value or "").strip(chr(10)) or "—")}</span></li>'
                if answered else f"<li>{_h(' '.join(f.label.split()))}</li>"
                for f in e.fields
            )
            body.append(f'<ul class="fields">{items}</ul>')
        elif e.text and e.role in _MARKDOWN_ROLES:
            body.append(f'<div class="md">{_markdown_html(e.text)}</div>')
        elif e.text:
            body.append(f'<pre class="text">{_h(e.text.rstrip(chr(10)))}</pre>')
        if e.attachments:
            files = "".join(f"<li>{_h(a.name)} ({_h(a.mime)}, {_h(_size(a.size))})</li>" for a in e.attachments)
            body.append(f'<ul class="files">{files}</ul>')
        if e.answer and not _fields_answered(e):
            body.append(f'<div class="answer">Answer: {_h(e.answer)}</div>')
        elif e.role in ("question", "permission", "plan") and e.state and e.state != "answered":
            body.append(f'<div class="answer">{_h(e.state + (f" ({e.reason})" if e.reason else ""))}</div>')
    return f'<section class="entry {_h(e.role)}">{head}{"".join(body)}</section>'
