"""agentd.tool_outputs pages a kept output by bytes, on character boundaries: pages join into the
whole text, and an offset a client made up inside a character starts at the next one (no U+FFFD)."""

from __future__ import annotations

from pathlib import Path

from agentd.tool_outputs import ToolOutputs

TEXT = "añb€c𝄞d" * 50  # 1-, 2-, 3- and 4-byte characters


def test_pages_join_into_the_whole_text_and_an_offset_inside_a_character_starts_at_the_next(tmp_path: Path) -> None:
    outputs = ToolOutputs(tmp_path, 1 << 20)
    assert outputs.keep("c1", "", "i1", TEXT)
    data = TEXT.encode()
    for limit in (4, 5, 7, 64):  # a page holds at least one character (PAGE_BYTES in use)
        pages, offset = [], 0
        while True:
            page = outputs.read("c1", "", "i1", offset, limit=limit)
            assert page is not None
            pages.append(page[0])
            if page[1] == 0:
                break
            assert page[1] > offset
            offset = page[1]
        assert "".join(pages) == TEXT
    for offset in range(len(data)):
        page = outputs.read("c1", "", "i1", offset, limit=16)
        assert page is not None
        text, next_offset = page
        assert "\ufffd" not in text, (offset, text)
        start = offset
        while data[start] & 0xC0 == 0x80:
            start += 1
        assert text.encode() == data[start:next_offset or len(data)]
