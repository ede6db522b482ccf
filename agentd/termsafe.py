"""Agent-supplied text made safe to show: control characters become visible escapes.

An agent (or a tool it runs) controls much of what ``agentctl`` prints and
what a Markdown export holds: message text, tool input and output,
permission titles and commands, questions, todos, titles, errors. Written raw
to a terminal, control sequences in it would move the cursor (to overwrite a
permission line with a harmless-looking one), set the clipboard (OSC 52),
change the window title, or hide text. :func:`visible` shows every C0 control
character other than newline and tab, DEL, and every C1 control character
(U+0080-U+009F: ``\\x9b`` is a one-character CSI on many terminals) as a
``\\xNN`` escape, on a terminal and off it. A carriage return that ends a
line (``\\r\\n``) is a plain newline; any other carriage return is shown.
The Unicode bidirectional embeddings, overrides and isolates (U+202A-U+202E,
U+2066-U+2069) are shown as ``\\uNNNN``: they reorder what follows them on
screen ("Trojan Source"), so a title or a permission's command could read
otherwise than it is; the marks (U+200E, U+200F) stay, as real right-to-left
text uses them.

:func:`visible_all` does the same to every string inside a decoded value
(a msgspec Struct, dict keys and values, list), returning an object of the same type; the
value is returned unchanged (the same object) when it holds no control
character, which is the common case and costs one encode and one search.

Pure (``re`` only; msgspec on first use of :func:`visible_all`), imported by
both agentd (exports) and agentctl (human output);
JSON output does not use it (JSON escapes control characters itself).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

__all__ = ["visible", "visible_all", "visible_name"]

T = TypeVar("T")

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_TABLE = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}
_TABLE.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})
# What a control character looks like once msgspec has encoded a string: \u00XX for C0 (except
# \n \t \b \f \r, written short), DEL raw, C1 as two UTF-8 bytes. A superset is fine (a false hit
# only costs the slow path).
_ENCODED = re.compile(rb"\\u00[01][0-9a-fA-F]|\\[bfr]|\x7f|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


def visible(text: str) -> str:
    """``text`` with its control characters (not newline or tab) shown as ``\\xNN``, its bidi
    embeddings, overrides and isolates as ``\\uNNNN``; ``text`` itself when none."""
    if _CONTROL.search(text) is None:
        return text
    return text.replace("\r\n", "\n").translate(_TABLE)


def visible_name(text: str) -> str:
    """:func:`visible`, for a name shown on one line of a table (a file name, an id): a newline
    or a tab in it is shown as ``\\n`` or ``\\t`` too, never a row of its own."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def _walk(value: Any) -> Any:
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):  # keys too: an agent's tool input or unknown data names them
        return {_walk(k): _walk(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    return value


def visible_all(obj: T) -> T:
    """``obj`` (a Struct, or builtins) with :func:`visible` applied to every string it holds."""
    import msgspec  # here: agentctl's error path imports this module and must stay light

    if isinstance(obj, str):
        return visible(obj)  # type: ignore[return-value]
    try:
        if _ENCODED.search(msgspec.json.encode(obj)) is None:
            return obj
    except (TypeError, ValueError):
        return obj
    return msgspec.convert(_walk(msgspec.to_builtins(obj)), type(obj), strict=False)
