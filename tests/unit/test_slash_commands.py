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


def test_the_offered_names_in_a_message_are_one_line_each_and_bounded() -> None:
    from agentd import contract as c
    from agentd.slash_commands import _offered

    # A runtime's name with a newline would forge a line of the error agentctl prints.
    assert _offered([c.Command(name="new\nagentctl: forged"), c.Command(name="plan")]) == \
        "/new\\nagentctl: forged, /plan"
    many = _offered([c.Command(name=f"c{i}") for i in range(100_000)])
    assert many.endswith("/c49 and 99,950 more (agentctl commands lists them)") and len(many) < 1000
    assert _offered([]) == "none"
