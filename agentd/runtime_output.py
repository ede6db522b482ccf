"""What agentd accepts from a runtime's output: odd bytes, big messages, odd times, unknown kinds.

A runtime is untrusted and may be newer than agentd. These rules, each kept
here once and called by every reader of runtime output (ACP stdio and stderr,
the Copilot JSON-RPC reader and mapping, the Claude mapping, the script
provider's tool commands, the conversation service's journal encoder):

* **Odd bytes** (:func:`clean`, :func:`decode`, :func:`decode_json`,
  :data:`encoder`): invalid UTF-8 and lone UTF-16 surrogates (raw, or as a JSON
  escape such as ``\\ud800``) become U+FFFD REPLACEMENT CHARACTER, one for each
  maximal invalid subsequence (Python's ``errors="replace"``, the Unicode
  standard's "substitution of maximal subparts") and one for each lone
  surrogate. NUL and other control characters are kept (JSON writes NUL as
  ``\\u0000``); terminals are agentctl's concern. A message is never refused for
  its bytes: only JSON that stays invalid after the rule (broken framing)
  is an error.
* **Big messages** (:data:`MAX_MESSAGE_BYTES`): every reader takes one message
  up to 64 MiB; past that the turn fails with :func:`too_big`'s text (the size
  read and the ceiling) and the conversation takes the next prompt.
* **Big items** (:data:`MAX_ITEM_TEXT_CHARS`): a message streamed in chunks has no
  size of its own; its text is kept (journaled, held for snapshots and history) up
  to 10 Mi characters, then cut with a line saying how much (:func:`cut_text`).
* **Times** (:func:`utc`, :func:`parse_utc`): a runtime's time is kept in UTC
  (a naive one counts as UTC). One with no UTC value, at the edge of datetime's
  range (0001-01-01T00:00:00+01:00 overflows), or unreadable, is None: the
  caller says what stands in for it.
* **Unknown kinds** (:func:`unknown`): an event, update or item kind agentd does
  not know becomes an ``unknown`` record carrying the runtime's type name and
  its data verbatim (after the odd-bytes rule), logged at warning level once per
  provider and type for the daemon's life. Unknown *fields* of known kinds are
  ignored by the decoders (msgspec Structs do that by default).

No trio here; structlog for the once-per-type warning.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from typing import Any

import msgspec
import structlog

from .contract import MAX_JSON_NESTING, ToolCall, ToolOutputEvent, Unknown, UnknownEvent, nested_deeper_than

log = structlog.get_logger(__name__)

#: The largest single message (one JSON-RPC line, one SDK message) any runtime reader takes.
MAX_MESSAGE_BYTES = 64 << 20

#: The most characters of text one item keeps (an assistant or reasoning message streamed in
#: chunks, an item adopted from a runtime's transcript): 10 Mi, so that its record fits the
#: 64 MiB frame a client reads whatever the characters, with 4 MiB to spare for the rest of the
#: record: JSON writes a control character as six bytes (``\u0001``), any other in at most four.
MAX_ITEM_TEXT_CHARS = 10 << 20

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_decoder = msgspec.json.Decoder()
_warned: set[tuple[str, str]] = set()


def clean(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (everything else kept)."""
    if text.isascii():
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def cut_note(dropped: int) -> str:
    """The line that ends an item's text cut at :data:`MAX_ITEM_TEXT_CHARS`."""
    return (f"\n[agentd kept the first {MAX_ITEM_TEXT_CHARS:,} characters of this message; "
            f"{dropped:,} more were cut]")


#: Room past MAX_ITEM_TEXT_CHARS for the cut note of a text a provider cut already
CUT_NOTE_ROOM = 200


def cut_text(text: str) -> str:
    """``text``, or its first :data:`MAX_ITEM_TEXT_CHARS` characters and :func:`cut_note` when longer
    (by more than :data:`CUT_NOTE_ROOM`: a text cut already is left as it is)."""
    if len(text) <= MAX_ITEM_TEXT_CHARS + CUT_NOTE_ROOM:
        return text
    return text[:MAX_ITEM_TEXT_CHARS] + cut_note(len(text) - MAX_ITEM_TEXT_CHARS)


def decode(data: bytes) -> str:
    """Bytes of runtime output as text, invalid UTF-8 as U+FFFD (never raises)."""
    return data.decode("utf-8", "replace")


def scrub(value: Any) -> Any:
    """``value`` (plain JSON values) with :func:`clean` applied to every string and key."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def decode_json(data: bytes) -> Any:
    """One JSON message from a runtime, after the odd-bytes rule.

    Fast path: msgspec. A message msgspec refuses for its bytes (invalid UTF-8,
    a lone surrogate escape) is decoded again with the rule applied. Raises
    ``msgspec.DecodeError`` only for JSON that is broken beyond that, or nested
    more than contract.MAX_JSON_NESTING levels deep (both decoders recurse: a line of 200,000 ``[`` raised
    RecursionError, which took down the reader of every conversation on the runtime).
    """
    try:
        return within_nesting(data, _decoder.decode(data))
    except msgspec.DecodeError as exc:
        first = exc
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply to decode") from None
    try:
        value = json.loads(decode(data))  # the stdlib takes lone surrogate escapes
    except ValueError:
        raise first from None
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply to decode") from None
    return scrub(within_nesting(data, value))


def within_nesting(data: bytes, value: Any) -> Any:
    """``value`` decoded from ``data``, or DecodeError when it nests past MAX_JSON_NESTING (what
    decodes near the interpreter's limit fails to encode again deeper down the stack). Counted
    first, at C speed: only a message with that many brackets at all is walked."""
    if len(data) > 2 * MAX_JSON_NESTING and data.count(b"[") + data.count(b"{") > MAX_JSON_NESTING \
            and nested_deeper_than(value):
        raise msgspec.DecodeError(f"JSON nested more than {MAX_JSON_NESTING} levels deep")
    return value


class _SafeEncoder:
    """msgspec's JSON encoder that never fails on a lone surrogate in a str (the rule applied)."""

    def __init__(self) -> None:
        self._enc = msgspec.json.Encoder()

    def encode(self, obj: Any) -> bytes:
        try:
            return self._enc.encode(obj)
        except UnicodeEncodeError:
            return self._enc.encode(scrub(msgspec.to_builtins(obj)))


#: The encoder of every journal payload made from runtime output.
encoder = _SafeEncoder()


def utc(value: _dt.datetime | None) -> _dt.datetime | None:
    """``value`` in UTC (naive counts as UTC); None for None, or for a time with no UTC value
    (OverflowError at the edges of datetime's range: 0001-01-01T00:00:00+01:00)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    try:
        return value.astimezone(_dt.timezone.utc)
    except (OverflowError, ValueError):
        return None


def parse_utc(text: Any) -> _dt.datetime | None:
    """A runtime's RFC 3339 / ISO 8601 time string in UTC as :func:`utc`; None when ``text`` is
    no string, or no time, or has no UTC value."""
    if not isinstance(text, str) or not text:
        return None
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return utc(value)


def too_big(size: int, *, what: str = "message", complete: bool = True, ceiling: int = MAX_MESSAGE_BYTES) -> str:
    """The turn's error for a message over the ceiling (:data:`MAX_MESSAGE_BYTES`): its size and the ceiling."""
    size_text = f"{size:,} bytes" if complete else f"over {size:,} bytes (read so far, not yet ended)"
    mib = f" ({ceiling >> 20} MiB)" if ceiling % (1 << 20) == 0 else ""
    return f"the runtime sent a {what} of {size_text}, over the reader's ceiling of {ceiling:,} bytes{mib}"


_TOO_DEEP = f"(a payload nested more than {MAX_JSON_NESTING} levels deep, left out)"


def unknown(provider: str, type_name: str, data: Any) -> UnknownEvent:
    """The ``unknown`` event for a runtime kind agentd does not know; warns once per (provider, type)."""
    type_name = clean(str(type_name or "?"))
    key = (provider, type_name)
    if key not in _warned:
        _warned.add(key)
        log.warning("runtime.unknown_kind", provider=provider, type=type_name,
                    note="journaled verbatim as an unknown record; this agentd may be older than the runtime")
    try:
        raw = msgspec.to_builtins(data, str_keys=True)
        # Kept only while every later encode can take it (contract.MAX_JSON_NESTING); still never dropped.
        raw = _TOO_DEEP if nested_deeper_than(raw) else scrub(raw)
    except RecursionError:
        raw = _TOO_DEEP
    except (TypeError, ValueError):
        raw = clean(repr(data))
    return UnknownEvent(unknown=Unknown(provider=provider, type=type_name, data=raw))


def whole_output(call: ToolCall, full: str, item_id: str, agent_id: str = "") -> list[ToolOutputEvent]:
    """Mark ``call`` cut when its ``output`` is a display cut of ``full``; the event keeping ``full``.

    Sets ``call.cut`` to the UTF-8 bytes left out and returns the ToolOutputEvent
    to emit before the item (none when nothing was cut). ``full`` is bounded to
    :data:`MAX_MESSAGE_BYTES` (a runtime reader takes no more anyway).
    """
    if full == call.output or not full:
        return []
    size = len(full.encode("utf-8", "replace"))
    call.cut = max(1, size - len(call.output.encode("utf-8", "replace")))
    if size > MAX_MESSAGE_BYTES:
        full = full.encode("utf-8", "replace")[-MAX_MESSAGE_BYTES:].decode("utf-8", "ignore")
    return [ToolOutputEvent(item_id=item_id, output=clean(full), agent_id=agent_id)]
