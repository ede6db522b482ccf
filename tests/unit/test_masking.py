"""agentd.masking's rule on its own: which values, header values, JSON, and secrets split across deltas."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentd import masking

KEY = "sk-canary-3f9a1c7e5b2d4f608e1a9c3b7d5f2e4a"
TOKEN = "ghp_abcdefghijkl1234567890"


@pytest.fixture(autouse=True)
def _registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masking, "_registry", masking._Registry())
    masking.register(KEY, TOKEN, "short")


def test_the_environment_rule_takes_well_known_and_suffixed_names_of_eight_chars_or_more() -> None:
    env = {"GH_TOKEN": "t" * 8, "MY_DB_PASSWORD": "p" * 9, "SERVICE_KEY": "k" * 7, "HOME": "/home/someone",
           "OPENAI_API_KEY": "o" * 20, "GITHUB_TOKEN": "", "EDITOR": "vim-with-a-long-name"}
    assert sorted(masking.secret_names(env)) == ["GH_TOKEN", "MY_DB_PASSWORD", "OPENAI_API_KEY"]


def test_literals_headers_and_bearer_tokens_are_masked_and_short_values_are_not() -> None:
    text = (f"key={KEY}; Authorization: Bearer abc.DEF-123_456; x-api-key: 0123456789abcdef; "
            "Bearer tok987654321; short stays; the bearer of news")
    assert masking.mask_text(text) == (
        "key=[redacted]; Authorization: Bearer [redacted]; x-api-key: [redacted]; "
        "Bearer [redacted]; short stays; the bearer of news")


def test_json_is_masked_string_by_string_and_stays_valid() -> None:
    data = msgspec.json.encode({"text": f"a\n{KEY}", KEY: ["\"Authorization\": \"token s3cr3t-v4lue\""]})
    out = masking.mask_json(data + b"\n")
    assert out.endswith(b"\n")
    assert msgspec.json.decode(out) == {"text": "a\n[redacted]", "[redacted]": ['"Authorization": "token [redacted]"']}
    clean = b'{"text":"nothing to see"}'
    assert masking.mask_json(clean) is clean


def _stream(text: str, size: int) -> list[str]:
    deltas = masking.DeltaMasker()
    out = [deltas.feed("i", text[i:i + size]) for i in range(0, len(text), size)]
    rest = deltas.flush("i")
    return out + ([rest[1]] if rest else [])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 40])
def test_a_secret_split_across_deltas_never_goes_out_and_the_stream_is_the_masked_text(size: int) -> None:
    text = f"see {KEY} and Authorization: token zz9988776655 then X-Api-Key: q1w2e3r4t5y6 and {TOKEN}."
    out = _stream(text, size)
    assert "".join(out) == masking.mask_text(text)
    sent = "".join(out)
    for secret in (KEY, TOKEN, "zz9988776655", "q1w2e3r4t5y6"):
        assert secret[:6] not in sent


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="sk-canry3f9aAuthorizBe: xé", max_size=60), st.integers(1, 9), st.integers(0, 60))
def test_any_split_of_any_text_streams_exactly_the_masked_text(noise: str, size: int, at: int) -> None:
    text = noise[:at] + KEY + noise[at:]
    assert "".join(_stream(text, size)) == masking.mask_text(text)
    assert KEY[:8] not in "".join(_stream(text, size))


class _Everything:
    def __contains__(self, item: object) -> bool:
        return True


def _per_delta(text: str, size: int) -> list[str]:
    deltas = masking.DeltaMasker()
    return [deltas.feed("i", text[i:i + size]) for i in range(0, len(text), size)]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="sk-canry3f9aAuthorizBe: xé_ghpab1", max_size=80), st.integers(1, 9))
@example("say xaba", 8)
@example("an sk-ca then s", 7)
def test_the_short_end_check_holds_back_exactly_what_the_full_search_does(text: str, size: int) -> None:
    # DeltaMasker.feed skips the overlapping search when the chunk's last 4 bytes are in no prefix;
    # with that shortcut disabled (every 4 bytes "in" a prefix) each delta must come out the same.
    masking.register("abab-ab1-secret")  # ends like "xaba" are prefixes of 3 and of 1 byte at once
    fast = _per_delta(text, size)
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    fast_many = masking.DeltaMasker().feed_many("i", chunks, chunks)  # its ASCII shortcut: _ends_clear
    rule = masking._registry.rule
    saved = rule.grams4
    rule.grams4 = _Everything()  # type: ignore[assignment]
    rule.ends.clear()  # the shortcuts' memos of chunk ends
    rule.text_ends.clear()
    try:
        assert _per_delta(text, size) == fast
        assert masking.DeltaMasker().feed_many("i", chunks, chunks) == fast_many == fast
        assert set(rule.ends.values()) <= {-1} and set(rule.text_ends.values()) <= {-1}
    finally:
        rule.grams4 = saved
        rule.ends.clear()
        rule.text_ends.clear()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="sk-canry3f9aAuthorizBe: xé_ghpab1\ud800", max_size=12), max_size=12),
       st.integers(0, 12), st.text(alphabet="ab xA", max_size=3))
@example(["say xab", "a", "", "x"], 1, "")
@example(["an sk-ca", "nary-3f9a1c7e5b2d4f608e1a9c3b7d5f2e4a!"], 0, "")
def test_feed_many_is_feed_one_by_one(texts: list[str], split: int, before: str) -> None:
    one, many = masking.DeltaMasker(), masking.DeltaMasker()
    for deltas in (one, many):
        deltas.feed("i", before, "m0")  # something may be held for the item already
    metas = [f"m{i + 1}" for i in range(len(texts))]
    expected = [one.feed("i", t, m + "!") for t, m in zip(texts, metas)]
    keep = lambda m: m + "!"  # noqa: E731 (what is kept with held text, made only when needed)
    got = many.feed_many("i", texts[:split], metas[:split], keep) + many.feed_many("i", texts[split:], metas[split:], keep)
    assert got == expected
    assert many._held == one._held
    assert many.flush("i") == one.flush("i")


def test_the_open_header_search_starts_where_a_match_can_and_finds_the_same() -> None:
    # From 4,200 characters before the end it tried every position along a long token: agent text
    # of "bearer-" repeated made each delta ~10 ms of the event loop (quadratic in that window).
    import random
    import re
    import time

    pattern = re.compile(masking._HEADER_OPEN)
    parts = ["bearer", "Bearer", " ", "\t", "=", ":", "'", '"', "\\", "authorization", "x-api-key", "token", "abc",
             "-", ".", "!", "basic", "\n", "Proxy-Authorization", "x" * 50, "é", "bearer-" * 700, "a" * 4100]
    rnd = random.Random(4)
    for _ in range(20_000):
        text = "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 8)))
        whole = pattern.search(text, max(0, len(text) - 4200))
        quick = pattern.search(text, masking.open_header_start(text))
        assert (whole.span() if whole else None) == (quick.span() if quick else None), text[-80:]
    deltas = masking.DeltaMasker()
    t0 = time.perf_counter()
    out = [deltas.feed("i", "bearer-" * 600 + "!") for _ in range(300)]
    assert time.perf_counter() - t0 < 2.0  # ~0.05 s; it took 3-9 s
    assert out[0] == "bearer-" * 600 + "!"


def test_json_nested_too_deeply_to_walk_is_masked_as_text_and_stays_valid() -> None:
    # Decoded fine, it raised RecursionError in the walk: the record it belonged to was dropped.
    deep = b"[" * 700 + msgspec.json.encode({"auth": f"Bearer {TOKEN}", "literal": TOKEN}) + b"]" * 700
    masked = masking.mask_json(deep)
    assert TOKEN.encode() not in masked and masked.count(masking.REDACTED.encode()) == 2
    assert msgspec.json.decode(masked) is not None  # still JSON
