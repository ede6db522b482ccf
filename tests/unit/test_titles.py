"""agentd.titles: every title is one line of at most 200 characters, whoever gave it; a person's
longer one is refused, a runtime's is cut and cleaned of what no reply could encode."""

from __future__ import annotations

import pytest

from agentd import contract as c
from agentd.titles import MAX_TITLE_CHARS, fork_title, runtime_title, user_title


def test_a_persons_title_is_folded_and_refused_past_the_limit() -> None:
    assert user_title("  fix\n the\tbuild  ") == "fix the build"
    assert user_title("x" * MAX_TITLE_CHARS) == "x" * MAX_TITLE_CHARS
    with pytest.raises(c.Invalid):
        user_title("x" * (MAX_TITLE_CHARS + 1))


def test_a_runtimes_title_is_folded_cut_and_cleaned() -> None:
    assert runtime_title("nice \ud83d title") == "nice \ufffd title"  # a lone surrogate from a runtime's JSON
    assert runtime_title("one\nFAKE ROW") == "one FAKE ROW"
    long = runtime_title("word " * 1000)
    assert len(long) == MAX_TITLE_CHARS and long.endswith("…") and "\n" not in long
    assert runtime_title("😀" * 300) == "😀" * (MAX_TITLE_CHARS - 1) + "…"


def test_a_forks_title_marks_its_sources_and_keeps_within_the_limit() -> None:
    assert fork_title("fix the build") == "fix the build (fork)"
    assert fork_title("") == ""
    assert fork_title("x" * MAX_TITLE_CHARS) == "x" * (MAX_TITLE_CHARS - 8) + "… (fork)"
    assert len(fork_title("x" * MAX_TITLE_CHARS)) == MAX_TITLE_CHARS
    assert fork_title("x" * (MAX_TITLE_CHARS - 7)) == "x" * (MAX_TITLE_CHARS - 7) + " (fork)"
