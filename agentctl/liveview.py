"""What the live view adds on a terminal: Markdown, a live region, a bell and a notification.

Used by :class:`agentctl.render.Renderer` when it writes to a terminal
(``live=True``: ``run``, ``send --follow``, ``attach``, ``tail`` with stdout a
tty, never with ``--json``). Nothing here runs for a pipe, so what scripts read
stays plain text.

* :func:`markdown` renders assistant text with rich (imported here, on first
  use, never by ``agentctl status`` and the other short commands).
* :func:`commit_point` says how much of a streamed text is whole Markdown
  blocks, which can be printed for good; the rest waits in the live region.
* The live region (:func:`fit`, :data:`SPINNER`) is the few lines at the bottom
  that are redrawn in place: the text still streaming, the newest output lines
  of a running tool, a spinner with the elapsed time.
* :class:`Notifier` rings the terminal bell and sends a desktop notification
  (``notify-send``, where installed) when an interaction waits for a person;
  ``[agentctl] bell`` and ``notify`` in agentd.toml turn them off.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import unicodedata
from typing import Any, TextIO

#: spinner frames, one every 0.1 s
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPINNER_ASCII = "|/-\\"
#: newest output lines of a running tool shown under it
TOOL_TAIL_LINES = 5
#: lines of text still streaming shown in the live region (the rest scrolls when it is whole)
TEXT_TAIL_LINES = 6


_PAD = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal columns (wide characters count two), so it never wraps."""
    cols = 0
    for i, ch in enumerate(text):
        w = 2 if unicodedata.east_asian_width(ch) in ("W", "F") else (0 if unicodedata.combining(ch) else 1)
        if cols + w > width:
            return text[:i]
        cols += w
    return text


def rows(text: str, width: int, n: int) -> list[str]:
    """The last ``n`` terminal rows of ``text`` wrapped at ``width`` columns (what a terminal would show)."""
    out: list[str] = []
    for line in text.split("\n")[-n:]:
        while True:
            row = fit(line, width)
            out.append(row)
            line = line[len(row):]
            if not line or not row:
                break
    return out[-n:]


def _fence(line: str) -> str:
    s = line.lstrip()
    if len(line) - len(s) > 3:
        return ""
    for mark in ("```", "~~~"):
        if s.startswith(mark):
            return mark
    return ""


def commit_point(text: str) -> int:
    """How many characters at the start of ``text`` are whole Markdown blocks (0: none yet).

    A block ends at a blank line outside a code fence, after a closed fence,
    or after a heading line. Only whole lines count: the last, unfinished line
    always waits.
    """
    pos = 0
    cut = 0
    fence = ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        pos += len(line)
        mark = _fence(line)
        if fence:
            if mark == fence and line.strip() == mark:
                fence = ""
                cut = pos
            continue
        if mark:
            fence = mark
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            cut = pos
    return cut


_MARKDOWN: Any = None


def _markdown_class() -> Any:
    """rich's Markdown with left-aligned headings and agent HTML shown as the text it is."""
    global _MARKDOWN
    if _MARKDOWN is None:
        from rich.markdown import Heading, Markdown

        class _Heading(Heading):
            LEVEL_ALIGN = {f"h{n}": "left" for n in range(1, 7)}

        class _Markdown(Markdown):
            elements = {**Markdown.elements, "heading_open": _Heading}

            def __init__(self, text: str, **kw: Any) -> None:
                super().__init__(text, **kw)
                _html_as_text(self.parsed)

        _MARKDOWN = _Markdown
    return _MARKDOWN


def _html_as_text(tokens: list[Any]) -> None:
    # rich drops HTML; agent-written HTML is shown as written, never interpreted nor lost
    for tok in tokens:
        if tok.type == "html_block":
            tok.type, tok.info = "code_block", ""
        elif tok.type == "html_inline":
            tok.type = "text"
        if tok.children:
            _html_as_text(tok.children)


def markdown(text: str, width: int, color: bool) -> list[str]:
    """``text`` rendered as Markdown for a terminal ``width`` columns wide, as lines.

    Headings, emphasis, lists, quotes, tables and code blocks (highlighted
    with Pygments when ``color``); links are shown with their address, not
    as terminal hyperlinks; HTML is shown as written. ``text`` is agent text
    already made visible (agentd.termsafe): rich markup in it is not
    interpreted. No blank line starts or ends the result.
    """
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                      color_system="256" if color else None, highlight=False, emoji=False,
                      markup=False, soft_wrap=False, legacy_windows=False)
    console.print(_markdown_class()(text, code_theme="monokai", hyperlinks=False))
    out = buf.getvalue().split("\n")
    # rich pads each line to the width; the padding is dropped unless it paints a background (code)
    out = [ln if "\x1b[48;" in ln else _PAD.sub(r"\1", ln) for ln in out]
    while out and not _SGR.sub("", out[-1]).strip():
        out.pop()
    while out and not _SGR.sub("", out[0]).strip():
        out.pop(0)
    return out


def is_live(stream: TextIO) -> bool:
    """Whether the live view may redraw on ``stream``: a terminal, and not ``TERM=dumb``."""
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------------- notifications


def notify_settings() -> tuple[bool, bool]:
    """(bell, desktop notification) from ``[agentctl]`` in agentd.toml; both on by default.

    Reads ``$AGENTD_CONFIG``, else the default config path. A file agentd
    itself would refuse is not agentctl's to report: the defaults apply.
    """
    import tomllib
    from pathlib import Path

    from agentd.config import default_config_path

    path = os.environ.get("AGENTD_CONFIG", "")
    p = Path(path) if path else default_config_path()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True, True
    import msgspec

    from agentd.config import AgentctlConfig

    try:
        cfg = msgspec.convert(data.get("agentctl", {}), AgentctlConfig)
    except msgspec.ValidationError:
        return True, True
    return cfg.bell, cfg.notify


class Notifier:
    """Tells a person that an interaction waits for them, once per interaction.

    ``out`` gets the bell (BEL); the desktop notification is ``notify-send``
    found on PATH, started and not waited for (reaped by :meth:`close`).
    Never raises: a missing or failing notify-send changes nothing else.
    """

    def __init__(self, out: TextIO, *, bell: bool = True, desktop: bool = True) -> None:
        self.out = out
        self.bell = bell
        self.desktop = desktop
        self._told: set[str] = set()
        self._procs: list[subprocess.Popen[Any]] = []

    def waiting(self, conversation: str, interaction_id: str, kind: str, title: str) -> None:
        """An interaction ``interaction_id`` of ``conversation`` waits for a person."""
        if interaction_id in self._told:
            return
        self._told.add(interaction_id)
        if self.bell:
            try:
                self.out.write("\a")
                self.out.flush()
            except (OSError, ValueError):
                pass
        if not self.desktop:
            return
        exe = shutil.which("notify-send")
        if exe is None:
            return
        summary = f"agentd: {kind} waiting"
        body = f"{title}\nconversation {conversation[:12]}: agentctl attach {conversation[:12]}"
        try:
            self._procs.append(subprocess.Popen(
                [exe, "--app-name=agentctl", summary, body], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        except OSError:
            pass
        self._procs = [p for p in self._procs if p.poll() is None]

    def close(self, timeout: float = 2.0) -> None:
        """Reap the notify-send processes started (they end in milliseconds)."""
        for p in self._procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
