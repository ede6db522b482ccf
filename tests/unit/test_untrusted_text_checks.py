"""Checks that run on text a client or an agent chose take linear time.

Each replaced a regex that backtracked quadratically: an ``email`` form answer
such as ``a@....@`` (checked on the event loop before any length limit) and a
Copilot shell output made of ``<shellId: `` repeated on one line each held the
whole daemon for seconds per few hundred KB; an agent's line of backtick runs
none closes (`` ` x `` x ``` ...``) took the Markdown export's code-span search a
minute per 80 KB, holding up every export. On the adversarial inputs below
the old regexes take half a minute or more, the checks a millisecond, so the
generous bound only fails on a return to quadratic time.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from agentd import contract as c
from agentd.export import _md_inline
from agentd.providers.copilot._mapping import strip_shell_trailer

#: what the checks replaced: the reference for what they must still accept and strip
OLD_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
OLD_TRAILER = re.compile(r"\n?<shellId: [^>\n]*>\s*$")
#: far above the checks' time on these inputs (~1 ms), far below the old regexes' (30 s and more)
BOUND_S = 2.0


def _email_form() -> c.Interaction:
    field = c.Field(name="email", type="string", format="email")
    return c.Interaction(id="f", kind=c.InteractionKind.QUESTION, title="Form",
                         questions=[c.Question(text="Email", custom=True, field=field)])


@pytest.mark.parametrize("text, ok", [
    ("ada@example.org", True), ("a@b.c", True), ("a.b@c.d.e", True),
    ("ada@example", False), ("@example.org", False), ("ada@.org", False), ("ada@org.", False),
    ("a@b@c.d", False), ("ada @example.org", False), ("ada@exa\u2003mple.org", False),
])
def test_an_email_answer_is_checked_as_before(text: str, ok: bool) -> None:
    answer = c.Answer(answers=[[text]])
    if ok:
        c.validate_answer(_email_form(), answer)
    else:
        with pytest.raises(c.Invalid, match="valid email"):
            c.validate_answer(_email_form(), answer)


def test_the_email_check_agrees_with_the_old_regex_on_random_text() -> None:
    rnd = random.Random(7)
    for _ in range(50_000):
        text = "".join(rnd.choice("a@. \n\u2003x") for _ in range(rnd.randint(0, 9)))
        assert c._FORMAT_CHECKS["email"](text) == (OLD_EMAIL.fullmatch(text) is not None), repr(text)


def test_an_email_answer_built_to_backtrack_is_refused_at_once() -> None:
    t0 = time.perf_counter()
    with pytest.raises(c.Invalid):
        c.validate_answer(_email_form(), c.Answer(answers=[["a@" + "." * 100_000 + "@"]]))
    assert time.perf_counter() - t0 < BOUND_S


@pytest.mark.parametrize("text, stripped", [
    ("done\n<shellId: 3>\n", "done"),
    ("done<shellId: 3>  ", "done"),
    ("<shellId: 3>", ""),
    ("a\n<shellId: x <shellId: 2>\n", "a"),  # the first on its line, as the regex's leftmost match
    ("a <shellId: 1> b", "a <shellId: 1> b"),
    ("a\n<shellId: 1>\nb>", "a\n<shellId: 1>\nb>"),
    ("no trailer", "no trailer"),
])
def test_the_shell_trailer_is_stripped_as_before(text: str, stripped: str) -> None:
    assert strip_shell_trailer(text) == stripped == OLD_TRAILER.sub("", text)


def test_the_shell_trailer_strip_agrees_with_the_old_regex_on_random_text() -> None:
    parts = ["<shellId: ", ">", "\n", " ", "a", "\x1c", "\t", "<", "1"]
    rnd = random.Random(11)
    for _ in range(50_000):
        text = "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 8)))
        assert strip_shell_trailer(text) == OLD_TRAILER.sub("", text), repr(text)


@pytest.mark.parametrize("text", [
    "<shellId: " * 60_000,  # one line of openings: each ran to the line's end
    "<shellId: " * 60_000 + ">",
    ("x<shellId: >" + " " * 60 + "y") * 60_000,
])
def test_shell_output_built_to_backtrack_is_stripped_at_once(text: str) -> None:
    t0 = time.perf_counter()
    strip_shell_trailer(text)
    assert time.perf_counter() - t0 < BOUND_S


def _spans_by_hand(text: str) -> list[tuple[int, int]]:
    """CommonMark's code spans on one line, found the plain way: from each maximal run of n
    backticks, the next maximal run of exactly n closes it; else the run is text."""
    def run_end(at: int) -> int:
        while at < len(text) and text[at] == "`":
            at += 1
        return at

    spans, i = [], 0
    while i < len(text):
        if text[i] != "`":
            i += 1
            continue
        j = run_end(i)
        k, close = j, None
        while k < len(text) and close is None:
            if text[k] != "`":
                k += 1
                continue
            e = run_end(k)
            close, k = (e if e - k == j - i else None), e
        if close:
            spans.append((i, close))
        i = close or j
    return spans


@pytest.mark.parametrize("text, shown", [
    ("a `<b>` c <d>", "a `<b>` c &lt;d>"),
    ("``x ` y`` <z>", "``x ` y`` &lt;z>"),
    ("` open <x> and ``two`` ![i](u)", "` open &lt;x> and ``two`` \\![i](u)"),
    ("```", "```"), ("`a``b`", "`a``b`"),
    # A run is whole: the old regex took ``` as ` and ``, and its ` closed by a later `.
    ("``` a![a`` ``````", "``` a\\![a`` ``````"), ("``a` <", "``a` &lt;"),
])
def test_code_spans_keep_their_text_and_the_rest_is_made_safe(text: str, shown: str) -> None:
    assert _md_inline(text) == shown


def test_the_code_span_search_finds_what_commonmark_does_on_random_text() -> None:
    rnd = random.Random(13)
    for _ in range(50_000):
        text = "".join(rnd.choice(["`", "``", "```", "a", "<", "![", " "]) for _ in range(rnd.randint(0, 12)))
        out, pos = [], 0
        for start, end in _spans_by_hand(text):
            out += [text[pos:start].replace("<", "&lt;").replace("![", "\\!["), text[start:end]]
            pos = end
        out.append(text[pos:].replace("<", "&lt;").replace("![", "\\!["))
        assert _md_inline(text) == "".join(out), repr(text)


@pytest.mark.parametrize("text", [
    "x".join("`" * i for i in range(1, 1_000)),  # ~500 KB of runs no later run closes
    "`" + " `` " * 100_000,
])
def test_backtick_runs_built_to_backtrack_are_made_safe_at_once(text: str) -> None:
    t0 = time.perf_counter()
    _md_inline(text)
    assert time.perf_counter() - t0 < BOUND_S
