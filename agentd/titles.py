"""Conversation titles: one rule for every way a title arrives.

A title is shown on one line of a listing (``agentctl ls``, ``import``, an
export's heading), so a newline in it would forge a row. Each title has its
whitespace folded (every run of whitespace, newlines included, becomes one
space) and holds at most :data:`MAX_TITLE_CHARS` characters.

* A person's (``new --title``, ``title``, ``fork --title``): :func:`user_title`,
  Invalid when longer, so nothing a person typed is cut silently.
* A runtime's (its own title event, an adopted session's title): untrusted,
  :func:`runtime_title` also replaces lone surrogates (a runtime's JSON may
  carry ``\\ud83d``, which no reply could encode) and cuts it.
* One made from a prompt: :func:`title_from_prompt`.
* A fork's, when ``fork`` names none: its source's, marked (:func:`fork_title`), so
  ``agentctl ls`` tells the two apart.
"""

from __future__ import annotations

from . import contract as c
from .runtime_output import clean

#: The longest title, in characters.
MAX_TITLE_CHARS = 200
#: Titles made from a prompt are cut to about this many characters, on a word boundary.
PROMPT_TITLE_CHARS = 60


def _fold(text: str) -> str:
    return " ".join(text.split())


def user_title(title: str) -> str:
    """A title a person gave, its whitespace folded; raises Invalid over :data:`MAX_TITLE_CHARS`."""
    title = _fold(title)
    if len(title) > MAX_TITLE_CHARS:
        raise c.Invalid(f"a title takes at most {MAX_TITLE_CHARS} characters")
    return title


def runtime_title(title: str) -> str:
    """A title a runtime gave: lone surrogates replaced by U+FFFD, whitespace folded, cut to
    :data:`MAX_TITLE_CHARS` (an ellipsis marks the cut)."""
    title = _fold(clean(title))
    return title if len(title) <= MAX_TITLE_CHARS else title[:MAX_TITLE_CHARS - 1] + "…"


def fork_title(source: str) -> str:
    """A fork's title from its source's: ``"<source> (fork)"``, the source's part cut (an ellipsis
    marks the cut) to keep within :data:`MAX_TITLE_CHARS`; "" for an untitled source."""
    if not source:
        return ""
    mark = " (fork)"
    room = MAX_TITLE_CHARS - len(mark)
    return (source if len(source) <= room else source[:room - 1] + "…") + mark


def title_from_prompt(text: str, limit: int = PROMPT_TITLE_CHARS) -> str:
    """A short title from a prompt: its first non-blank line, whitespace collapsed, cut on a word
    boundary to at most ``limit`` characters (an ellipsis marks the cut)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _fold(line)
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 3:
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "…"
