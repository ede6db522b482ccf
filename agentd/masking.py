"""Secrets masked in everything agentd writes or sends: one rule, one compiled pattern.

What counts as a secret (the rule; :func:`load` applies it at start):

* a variable of agentd's own environment whose name is one of
  :data:`WELL_KNOWN` or ends in one of :data:`SUFFIXES` (``_TOKEN``, ``_KEY``,
  ``_SECRET``, ``_PASSWORD``, ...; any case), and the variables a provider
  names as holding its key (``api_key_env``, ``byok.api_key_env``) whatever
  their name;
* a value of a provider's configured ``env`` under such a name;
* every value :func:`register`-ed while running: the WebSocket gateway token,
  a key a provider reads when its runtime starts;
* the value of an ``Authorization:`` / ``Proxy-Authorization:`` /
  ``X-Api-Key:`` / ``Api-Key:`` / ``X-Goog-Api-Key:`` header (after a scheme
  such as ``Bearer``, ``Basic`` or ``token`` when there is one) and the token
  after the word ``Bearer``, wherever they appear: a token is 8 or more
  RFC 6750 ``b64token`` characters (letters, digits, ``-._~+/``, trailing ``=``).

Literal values shorter than :data:`MIN_LENGTH` characters (after stripping)
are not secrets: masking ``true`` or ``1`` everywhere would garble text and
hide nothing. Each occurrence becomes :data:`REDACTED` (``[redacted]``); a
header keeps its name and scheme (``Authorization: Bearer [redacted]``).

Where it applies: journal records before they are appended (the encoded
line is also the live frame), ephemeral live records (text deltas, todos,
activity), provider events before they change conversation state (titles,
pending interactions, snapshots), log lines (agentd.logs, relayed runtime
stderr included) and exports. Text deltas go through :class:`DeltaMasker`,
which holds back the end of a delta while it could be the start of a secret,
so a secret split across deltas never reaches a subscriber in clear.

Cost: one search of a compiled alternation per record over its encoded bytes;
only a record that matches is decoded, masked and encoded again (see
RELIABILITY.md for the measured figure). Thread-safe; imports neither trio
nor structlog.
"""

from __future__ import annotations

import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
from ahocorasick_rs import BytesAhoCorasick

__all__ = [
    "MIN_LENGTH",
    "REDACTED",
    "DeltaMasker",
    "is_secret_name",
    "load",
    "mask_json",
    "mask_rendered",
    "mask_struct",
    "mask_text",
    "forget",
    "register",
    "secret_names",
]

REDACTED = "[redacted]"
#: Literal secrets shorter than this (after stripping) are ignored.
MIN_LENGTH = 8

#: Environment variables that hold secrets whatever the suffix rule says.
WELL_KNOWN = frozenset({
    "GH_TOKEN", "GITHUB_TOKEN", "COPILOT_GITHUB_TOKEN", "GH_ENTERPRISE_TOKEN", "GITHUB_ENTERPRISE_TOKEN",
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "GEMINI_API_KEY",
    "GOOGLE_API_KEY", "COPILOT_PROVIDER_API_KEY", "CODEX_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "HF_TOKEN", "NPM_TOKEN", "PGPASSWORD", "DATABASE_URL",
})
#: A variable whose name ends in one of these (any case) holds a secret.
SUFFIXES = ("_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_PASSWD", "_PASS", "_PAT", "_CREDENTIALS", "_APIKEY")

_HEADERS = r"(?:proxy-)?authorization|x-api-key|x-goog-api-key|api-key"
_SCHEMES = r"bearer|basic|token|digest"
_TOKEN_CHARS = r"[A-Za-z0-9._~+/-]"
#: A header (or the word Bearer) and its value: group "lead" is kept, the rest masked.
# Possessive (*+, {m,n}+) where what follows cannot take what was given back (a token has no
# "=" or space): the same matches, without backtracking over every "bearer-bearer-..." in agent text
# (27 ms a search for 600 of them; a delta stream of such text held the daemon for seconds).
_HEADER = (
    rf"(?P<lead>(?i:\b(?:{_HEADERS})[\"'\\\s]{{0,4}}+[:=][\"'\\\s]{{0,4}}+(?:(?:{_SCHEMES})\s++)?|\bbearer\s++))"
    rf"{_TOKEN_CHARS}{{8,}}+=*+"
)
#: A delta ending inside a header (or the start of one's name) is held back from here.
_HEADER_OPEN = (
    rf"(?i:\b(?:{_HEADERS})[\"'\\\s]{{0,4}}+(?:[:=][\"'\\\s]{{0,4}}+(?:(?:{_SCHEMES})\s*+)?{_TOKEN_CHARS}{{0,4096}}+=*+)?"
    rf"|\bbearer\s*+{_TOKEN_CHARS}{{0,4096}}+=*+)\Z"
)
_KEYWORDS = ("authorization", "proxy-authorization", "x-api-key", "x-goog-api-key", "api-key", "bearer")
#: Read backwards from a buffer's end: the "=" padding, token and space an open header ends in.
#: A match of _HEADER_OPEN starts at most _LEAD_MAX characters before them (the longest header
#: name, quotes, ":" and scheme), so its search starts there, not at each of thousands of
#: positions it would try along a long token (see open_header_start).
_TAIL_REV = re.compile(rf"=*+{_TOKEN_CHARS}*+\s*+")
_LEAD_MAX = 40

T = TypeVar("T")
_json = msgspec.json.Encoder()


def open_header_start(buf: str) -> int:
    """Where a search for an open header at the end of ``buf`` (``_HEADER_OPEN``) may start: the
    same match as from 4,200 characters before the end, in time linear in those characters."""
    start = max(0, len(buf) - 4200)
    tail = _TAIL_REV.match(buf[start:][::-1])
    return max(start, len(buf) - (tail.end() if tail else 0) - _LEAD_MAX)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable called ``name`` holds a secret (see the module doc)."""
    upper = name.upper()
    return upper in WELL_KNOWN or upper.endswith(SUFFIXES)


def secret_names(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that :func:`is_secret_name` accepts, with a value worth masking."""
    return [k for k, v in environ.items() if is_secret_name(k) and len(v.strip()) >= MIN_LENGTH]


class _Rule:
    """The compiled patterns of one set of literal secrets (immutable; replaced whole on change).

    Aho-Corasick automata over the secrets and header keywords (ASCII
    lowered) say in one pass whether anything may need masking (a superset:
    lowering only adds candidates); the regexes then do the exact work on the
    rare text that has a candidate.
    """

    def __init__(self, values: frozenset[str]) -> None:
        self.values = values
        ordered = sorted(values, key=len, reverse=True)  # the longest of overlapping secrets wins
        literals = "|".join(re.escape(v) for v in ordered)
        self.text = re.compile(_HEADER + (f"|{literals}" if literals else ""))
        # Rendered text (a log line already encoded as JSON) may hold the escaped form too.
        escaped = {v for s in ordered for v in (s, _json.encode(s).decode()[1:-1])}
        rendered = "|".join(re.escape(v) for v in sorted(escaped, key=len, reverse=True))
        self.rendered = re.compile(_HEADER + (f"|{rendered}" if rendered else ""))
        keywords = {k.encode() for k in _KEYWORDS}
        # Text is searched as UTF-8 with ASCII letters lowered (bytes.lower): a superset, cheap.
        self.candidates = BytesAhoCorasick(sorted({_utf8(v).lower() for v in escaped} | keywords))
        # Encoded JSON holds a secret in its escaped form (msgspec escapes per character).
        forms = {_json.encode(v)[1:-1].lower() for v in values}
        self.bytes_candidates = BytesAhoCorasick(sorted(forms | keywords))
        # Every prefix of a secret (as UTF-8), and of a header keyword: an overlapping search of a
        # chunk's end finds the longest end that may be the start of one (see DeltaMasker).
        starts: dict[bytes, bool] = {}  # prefix -> it is only a keyword's (held at a word start only)
        for word in values:
            data = _utf8(word)
            for i in range(1, len(data) + 1):
                starts[data[:i]] = False
        for word in (w for k in _KEYWORDS for w in (k, k.title(), k.upper())):
            for i in range(1, len(word) + 1):
                starts.setdefault(word[:i].encode(), True)
        self.starts = list(starts)
        self.start_flags = starts
        self.keyword_only = [starts[p] for p in self.starts]
        # Every 4 bytes inside a prefix: a chunk whose last 4 bytes are none of these ends in no
        # prefix of 4 bytes or more, so only its last 3 ends need a look (DeltaMasker.feed).
        self.grams4 = frozenset(p[i:i + 4] for p in starts for i in range(len(p) - 3))
        #: last 4 bytes of a chunk -> short_end of them (a bounded memo: feed runs once per delta)
        self.ends: dict[bytes, int] = {}
        #: the same for the last 4 characters of an ASCII chunk (DeltaMasker.feed_many)
        self.text_ends: dict[str, int] = {}
        self.starts_ac = BytesAhoCorasick(self.starts)
        self.window = max((len(p) for p in self.starts), default=0)
        self.open_header = re.compile(_HEADER_OPEN)


    def short_end(self, last4: bytes) -> int:
        """For a chunk ending in the 4 bytes ``last4``: how many of its last bytes (0-3) may be
        the start of a secret, held back; -1 when a longer prefix may end there (the full search).

        The common case: no prefix of 4 bytes or more ends here (``last4`` is in no prefix);
        the longest of the 3 short ends wins. It depends on these 4 bytes only (the word check
        of a 3-byte end looks at the byte before it).
        """
        if last4 in self.grams4:
            return -1
        flags = self.start_flags
        for i in (1, 2, 3):
            flag = flags.get(last4[i:])
            if flag is not None and not (flag and _word_before(last4, i)):
                return 4 - i
        return 0


#: At most this many chunk ends are memoized per rule (_Rule.ends); then the memo starts over.
_ENDS_MEMO = 4096


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rule = _Rule(frozenset())

    def add(self, values: Iterable[str]) -> frozenset[str]:
        new = {v for v in values if isinstance(v, str) and len(v.strip()) >= MIN_LENGTH}
        with self._lock:
            added = frozenset(new - self.rule.values)
            if added:
                self.rule = _Rule(self.rule.values | added)
        return added

    def discard(self, values: frozenset[str]) -> None:
        with self._lock:
            if values & self.rule.values:
                self.rule = _Rule(self.rule.values - values)


_registry = _Registry()


def register(*values: str | None) -> frozenset[str]:
    """Mask every later occurrence of each value (too short or empty ones are ignored). Thread-safe.

    Returns the values that were not masked before (for :func:`forget`). The compiled rule is
    rebuilt whole, in time and memory growing with the square of the longest value's length
    (every prefix is kept, for :class:`DeltaMasker`): about 0.25 s for 2,048 characters. Bound
    what a client may have registered (agentd.accounts.MAX_TOKEN_CHARS) and call this from a
    worker thread when the value is long."""
    return _registry.add(v for v in values if v)


def forget(values: frozenset[str]) -> None:
    """Stop masking ``values``, as :func:`register` returned them (a token a runtime refused:
    masking it on would hide that text everywhere for the daemon's life). Thread-safe."""
    _registry.discard(values)


def load(environ: Mapping[str, str], providers: Any = None) -> None:
    """Register the secrets of agentd's environment and of ``providers`` (a ProvidersConfig), by the rule."""
    values = [environ[k] for k in secret_names(environ)]
    if providers is not None:
        for name in _key_variables(providers):
            values.append(environ.get(name, ""))
        for section in _sections(providers):
            env = getattr(section, "env", None) or {}
            values.extend(env[k] for k in secret_names(env))
    register(*values)


def _sections(providers: Any) -> list[Any]:
    return [providers.copilot, providers.claude, providers.codex, *providers.acp.values()]


def _key_variables(providers: Any) -> list[str]:
    byok, codex = providers.copilot.byok, providers.codex.model_provider
    names = [byok.api_key_env if byok is not None else "", providers.claude.api_key_env,
             codex.api_key_env if codex is not None else ""]
    return [n for n in names if n]


def _sub(match: re.Match[str]) -> str:
    lead = match.group("lead")
    return REDACTED if lead is None else lead + REDACTED


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _candidate(rule: _Rule, text: str) -> bool:
    return bool(rule.candidates.find_matches_as_indexes(_utf8(text).lower()))


def mask_text(text: str) -> str:
    """``text`` with every secret replaced (the same object when there is none)."""
    rule = _registry.rule
    if not _candidate(rule, text):
        return text
    return rule.text.sub(_sub, text)


def mask_rendered(text: str) -> str:
    """:func:`mask_text` that also catches secrets in their JSON-escaped form (rendered log lines)."""
    rule = _registry.rule
    if not _candidate(rule, text):
        return text
    return rule.rendered.sub(_sub, text)


def _mask_value(value: Any) -> Any:
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {mask_text(k): _mask_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_value(v) for v in value]
    return value


def mask_json(data: bytes) -> bytes:
    """Encoded JSON ``data`` with every secret in its strings replaced (``data`` itself when none).

    The search runs on the bytes; only data that matches is decoded, masked
    string by string (keys too) and encoded again, so the result is always
    valid JSON; a trailing newline (a wire frame's) is kept. Data that is not
    JSON is masked as UTF-8 text, and so is JSON nested too deeply to walk.
    """
    if not _registry.rule.bytes_candidates.find_matches_as_indexes(data.lower()):
        return data
    try:
        value = msgspec.json.decode(data)
        masked = _json.encode(_mask_value(value))
        if masked == _json.encode(value):
            return data
    except msgspec.DecodeError:
        return mask_text(data.decode("utf-8", "replace")).encode()
    except RecursionError:
        # Nested deeper than the walk goes (an agent's value ~500 levels deep): masked as the
        # text it is, secrets in their JSON-escaped form too. What is masked is a secret's
        # characters, or a header's value, which holds no quote or backslash: the JSON stays valid.
        return mask_rendered(data.decode("utf-8", "replace")).encode()
    return masked + b"\n" if data.endswith(b"\n") else masked


def mask_struct(obj: T) -> T:
    """A msgspec Struct (or any encodable value) with every secret replaced; ``obj`` itself when none."""
    data = _json.encode(obj)
    masked = mask_json(data)
    if masked is data:
        return obj
    return msgspec.json.decode(masked, type=type(obj))


def _word_before(data: bytes, i: int) -> bool:
    """Whether a word character (ASCII letter, digit, underscore, or any non-ASCII) precedes byte ``i``."""
    return i > 0 and (data[i - 1:i].isalnum() or data[i - 1] == 0x5F or data[i - 1] >= 0x80)


def _held_from(rule: _Rule, data: bytes) -> int:
    """Where the end of chunk ``data`` that may be the start of a secret begins (``len(data)``: none)."""
    n = len(data)
    if n >= 4:
        # The common case is decided by the last 4 bytes alone (see _Rule.short_end): memoized.
        last4 = data[-4:]
        ends = rule.ends
        back = ends.get(last4, -2)
        if back == -2:
            if len(ends) >= _ENDS_MEMO:
                ends.clear()
            back = ends[last4] = rule.short_end(last4)
        if back >= 0:
            return n - back
    held = n
    lo = max(0, n - rule.window)
    tail = data[lo:]  # may start inside a character: no prefix starts with a continuation byte
    for index, start, end in rule.starts_ac.find_matches_as_indexes(tail, overlapping=True):
        if end == len(tail) and lo + start < held and not (rule.keyword_only[index] and _word_before(data, lo + start)):
            held = lo + start
    return held


#: ``_LAST4(text) == text[-4:]``
_LAST4 = operator.itemgetter(slice(-4, None))


def _ends_clear(rule: _Rule, texts: list[str]) -> bool:
    """Whether no text of ``texts`` (ASCII, every one) ends in what may be the start of a secret.

    Decided by each text's last 4 characters alone (:meth:`_Rule.short_end` 0; memoized in
    ``rule.text_ends``): for ASCII they are its last 4 bytes, so where this says True
    :func:`_held_from` holds back nothing of any text. False when some text is shorter than 4
    or its end needs a look (then the caller asks :func:`_held_from` text by text).
    """
    ends = rule.text_ends
    lasts = list(map(_LAST4, texts))  # C speed: no Python frame per text
    backs = list(map(ends.get, lasts))
    if backs.count(0) == len(backs):
        return True
    for last, back in zip(lasts, backs):
        if back is None:
            if len(last) < 4:
                return False
            if len(ends) >= _ENDS_MEMO:
                ends.clear()
            back = ends[last] = rule.short_end(last.encode())
        if back != 0:
            return False
    return True


class DeltaMasker:
    """Masks streamed text per item, never letting a secret split across chunks out in clear.

    :meth:`feed` returns what may be sent now: the chunk (after what was held
    before) masked, minus its end when that end could be the start of a
    secret (a prefix of one, or of a header name) or sits inside a header
    value. :meth:`flush` returns what is still held for an item, masked, with
    the ``meta`` given with it (the caller's delta), for when the item is
    complete or the turn ends. What is sent for an item, in order, is exactly
    ``mask_text`` of all its text, so a subscriber sees the journaled item's
    text. The trade-off: up to one secret's length of text (or a header
    value) reaches subscribers one delta late.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[Any, str]] = {}

    def feed(self, key: str, text: str, meta: Any = None) -> str:
        """The part of ``text`` (after what is held for ``key``) that may be sent now, masked."""
        kept = self._held.pop(key, None) if self._held else None
        buf = kept[1] + text if kept else text
        if not buf:
            return buf
        rule = _registry.rule
        data = _utf8(buf)
        n = len(data)
        held = _held_from(rule, data)
        size = len(buf)
        cut = size if held == n else size - len(data[held:].decode("utf-8", "surrogatepass"))
        if not rule.candidates.find_matches_as_indexes(data.lower()):
            if cut == size:
                return buf  # nothing held back, nothing masked: the common case
            out, end = buf[:cut], cut
        else:
            m = rule.open_header.search(buf, open_header_start(buf))
            if m is not None and m.start() < cut:
                cut = m.start()
            out, end = self._mask_before(rule.text, buf, cut)
        if end < size:
            self._held[key] = (meta, buf[end:])
        return out

    def feed_many(self, key: str, texts: list[str], metas: Sequence[Any],
                  keep: Callable[[Any], Any] | None = None) -> list[str]:
        """``[feed(key, text, keep(meta)) for text, meta in zip(texts, metas)]``, the same results.

        ``keep`` (default: the meta itself) makes what is kept with held text of a meta; it is
        called only for a meta whose text is held (or for each, when there is a candidate).
        When nothing is held for ``key`` and nothing of ``texts`` is, the result is ``texts``
        itself (the same list object). One search for secrets over all of it (what is held,
        then every text): when there is none, no text has one, and each is only cut at an end
        that may start a secret.
        """
        kept = self._held.get(key)
        rest = kept[1] if kept else ""
        rule = _registry.rule
        joined = rest + "".join(texts)
        if rule.candidates.find_matches_as_indexes(_utf8(joined).lower()):
            if keep is not None:
                metas = [keep(m) for m in metas]
            return [self.feed(key, text, meta) for text, meta in zip(texts, metas)]
        if not rest and joined.isascii() and _ends_clear(rule, texts):
            return texts  # the common case: no end of any text may start a secret
        rest_meta = kept[0] if kept else None
        fresh = False  # rest_meta is one of metas (not yet made by keep)
        out: list[str] = []
        for text, meta in zip(texts, metas):
            buf = rest + text if rest else text
            if not buf:
                out.append(buf)
                rest, rest_meta = "", None
                continue
            data = _utf8(buf)
            n = len(data)
            held = _held_from(rule, data)
            if held == n:
                out.append(buf)
                rest, rest_meta = "", None
            else:
                cut = len(buf) - len(data[held:].decode("utf-8", "surrogatepass"))
                out.append(buf[:cut])
                rest, rest_meta, fresh = buf[cut:], meta, True
        if rest:
            self._held[key] = (keep(rest_meta) if fresh and keep is not None else rest_meta, rest)
        else:
            self._held.pop(key, None)
        return out

    @staticmethod
    def _mask_before(pattern: re.Pattern[str], buf: str, cut: int) -> tuple[str, int]:
        """Mask the matches that start before ``cut``; returns (text to send, where it ends)."""
        parts: list[str] = []
        pos = 0
        for match in pattern.finditer(buf):
            if match.start() >= cut:
                break
            parts.append(buf[pos:match.start()])
            parts.append(_sub(match))
            pos = match.end()
        end = max(cut, pos)
        parts.append(buf[pos:end])
        return "".join(parts), end

    def flush(self, key: str) -> tuple[Any, str] | None:
        """``(meta, text)`` held for ``key``, the text masked; None when nothing is."""
        held = self._held.pop(key, None)
        return (held[0], mask_text(held[1])) if held else None

    def flush_all(self) -> list[tuple[Any, str]]:
        """What is held for every item (see :meth:`flush`), in the order the items were held."""
        return [f for f in (self.flush(k) for k in list(self._held)) if f is not None]
