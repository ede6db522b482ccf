"""Which prompts are slash commands (agentd.slash_commands.parse)."""

from __future__ import annotations

import pytest

from agentd.slash_commands import parse


@pytest.mark.parametrize("text, expected", [
    ("/review", ("review", "")),
    ("/review the tests", ("review", "the tests")),
    ("/review  the\ntests  ", ("review", "the\ntests")),
    ("/plugin:cmd x", ("plugin:cmd", "x")),
    ("/memory-show", ("memory-show", "")),
    (" /review", None),  # a leading space: plain text
    ("/usr/bin is odd", None),  # a path, not a name
    ("//review", None),
    ("/", None),
    ("review", None),
    ("/-x", None),
])
def test_a_prompt_is_a_command_when_its_first_word_is_slash_name(text: str, expected: tuple[str, str] | None) -> None:
    assert parse(text) == expected
