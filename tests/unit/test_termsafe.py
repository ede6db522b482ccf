"""agentd.termsafe: agent text shown with its control characters visible (issue 12, terminal safety)."""

from __future__ import annotations

import msgspec

from agentd.termsafe import visible, visible_all, visible_name

C0 = [chr(c) for c in range(0x20) if chr(c) not in "\n\t"]
C1 = [chr(c) for c in range(0x7F, 0xA0)]  # DEL, then U+0080..U+009F (U+009B: a one-character CSI)


def test_every_c0_but_newline_and_tab_del_and_every_c1_is_shown_as_an_escape() -> None:
    for ch in C0 + C1:
        assert visible(f"a{ch}b") == f"a\\x{ord(ch):02x}b"
    assert visible("line\nnext\tcell") == "line\nnext\tcell"
    assert visible("up\x1b[1A\x1b[2Kallowed: ls") == "up\\x1b[1A\\x1b[2Kallowed: ls"
    assert visible("copy\x1b]52;c;ZXZpbA==\x07") == "copy\\x1b]52;c;ZXZpbA==\\x07"


def test_a_crlf_line_end_is_a_newline_and_a_lone_carriage_return_is_shown() -> None:
    assert visible("one\r\ntwo") == "one\ntwo"
    assert visible("fake\rallowed") == "fake\\x0dallowed"


def test_text_without_control_characters_is_returned_as_it_is() -> None:
    text = "plain text, ünïcode and emoji 🎉"
    assert visible(text) is text
    value = {"a": ["b", {"c": "d"}]}
    assert visible_all(value) is value


class _Tool(msgspec.Struct):
    title: str
    input: dict[str, object]
    lines: list[str]


def test_visible_all_reaches_every_string_of_a_struct_dict_keys_included() -> None:
    tool = _Tool(title="t\x1b]0;pwned\x07", input={"k\x9b31m": ["v\x1b[2J", 3], "ok": None}, lines=["x\x7f"])
    shown = visible_all(tool)
    assert isinstance(shown, _Tool)
    assert shown.title == "t\\x1b]0;pwned\\x07"
    assert shown.input == {"k\\x9b31m": ["v\\x1b[2J", 3], "ok": None}
    assert shown.lines == ["x\\x7f"]
    assert visible_all("a\x1bb") == "a\\x1bb"


BIDI = [chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]]


def test_bidi_embeddings_overrides_and_isolates_are_shown_and_the_marks_kept() -> None:
    # "Trojan Source": an override reorders what follows it, so text could read otherwise than it is.
    for ch in BIDI:
        assert visible(f"a{ch}b") == f"a\\u{ord(ch):04x}b"
    assert visible("rm -rf /tmp/x\u202e; txt.exe") == "rm -rf /tmp/x\\u202e; txt.exe"
    arabic = "مرحبا \u200fhello\u200e"  # right-to-left text with its marks, and a joiner in an emoji
    assert visible(arabic) is arabic and visible("👩\u200d💻") == "👩\u200d💻"
    tool = _Tool(title="title\u202eevil", input={"k": "v"}, lines=["x\u2067y"])
    shown = visible_all(tool)
    assert (shown.title, shown.lines) == ("title\\u202eevil", ["x\\u2067y"])


def test_a_name_shown_on_one_line_keeps_newlines_and_tabs_on_it() -> None:
    # A file named "new\nline.txt" split agentctl diff --stat's table: a crafted name showed a fake row.
    assert visible_name("new\nline.txt") == "new\\nline.txt" and visible_name("a\tb\x1b[2J") == "a\\tb\\x1b[2J"
    assert visible_name("plain.txt") == "plain.txt"
