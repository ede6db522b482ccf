"""Hypothesis strategies for control-protocol frames: valid requests of every op, and ways to break them.

Shared by the codec fuzz tests and the live-socket fuzz test. ``FRAMES`` counts
every frame handed to a decoder, for RELIABILITY.md's figures.
"""

from __future__ import annotations

import collections
from typing import Any

import msgspec
from hypothesis import strategies as st

from agentd import wire

#: frames fuzzed, by test
FRAMES: collections.Counter[str] = collections.Counter()

REQUEST_TYPES: list[type] = list(wire.Request.__args__)  # type: ignore[attr-defined]

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
#: any JSON value, nested
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=30,
)

_short_text = st.text(max_size=30)
_mi = msgspec.inspect


def for_type(t: Any) -> st.SearchStrategy[Any]:
    """Valid JSON values for a msgspec type (as msgspec.inspect describes it), bounds respected."""
    if isinstance(t, _mi.StrType):
        if t.pattern:
            return st.from_regex(t.pattern, fullmatch=True)
        return st.text(min_size=t.min_length or 0, max_size=min(t.max_length or 30, 30))
    if isinstance(t, _mi.BoolType):
        return st.booleans()
    if isinstance(t, (_mi.IntType, _mi.FloatType)):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**31))
        hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**31)
        if isinstance(t, _mi.IntType):
            return st.integers(min_value=int(lo), max_value=int(hi))
        return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
    if isinstance(t, _mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, _mi.EnumType):
        return st.sampled_from([m.value for m in t.cls])
    if isinstance(t, _mi.NoneType):
        return st.none()
    if isinstance(t, _mi.UnionType):
        return st.one_of([for_type(x) for x in t.types])
    if isinstance(t, (_mi.ListType, _mi.SetType, _mi.FrozenSetType, _mi.VarTupleType)):
        return st.lists(for_type(t.item_type), min_size=t.min_length or 0, max_size=3)
    if isinstance(t, _mi.DictType):
        keys = for_type(t.key_type) if isinstance(t.key_type, _mi.StrType) else st.text(max_size=8)
        return st.dictionaries(keys, for_type(t.value_type), max_size=3)
    if isinstance(t, _mi.StructType):
        return struct_fields(t)
    return json_values


def struct_fields(info: Any, *, skip: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """A struct as a dict: its required fields always, each optional one sometimes."""
    required = {f.encode_name: for_type(f.type) for f in info.fields if f.required and f.name not in skip}
    optional = {f.encode_name: for_type(f.type) for f in info.fields if not f.required and f.name not in skip}
    return st.fixed_dictionaries(required, optional=optional)


def valid_request(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    """Valid frames of request type ``cls``, as dicts (every field typed as its schema says)."""
    tag = cls.__struct_config__.tag  # type: ignore[attr-defined]
    fields = struct_fields(_mi.type_info(cls), skip=("id",))
    return st.tuples(st.integers(min_value=0, max_value=2**53), fields).map(lambda p: {"op": tag, "id": p[0], **p[1]})


def simple_fields(cls: type) -> list[tuple[str, Any]]:
    """(name, type) of ``cls``'s fields that are a plain str, int, bool or literal (not id)."""
    out = []
    for f in _mi.type_info(cls).fields:
        if f.name != "id" and isinstance(f.type, (_mi.StrType, _mi.IntType, _mi.BoolType, _mi.LiteralType)):
            out.append((f.encode_name, f.type))
    return out


#: a valid request of any op, as a dict
valid_requests = st.one_of([valid_request(cls) for cls in REQUEST_TYPES])


@st.composite
def mutated_request(draw: st.DrawFn) -> bytes:
    """A valid request broken one way or another, encoded."""
    req = dict(draw(valid_requests))
    how = draw(st.sampled_from(
        ["drop", "retype", "unknown", "huge", "deep", "utf8", "truncate", "flip", "op", "id", "dup"]
    ))
    keys = sorted(req)
    if how == "drop":
        req.pop(draw(st.sampled_from(keys)))
    elif how == "retype":
        req[draw(st.sampled_from(keys))] = draw(json_values)
    elif how == "unknown":
        req[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif how == "huge":
        req[draw(st.sampled_from(keys))] = "x" * draw(st.integers(min_value=10_000, max_value=300_000))
    elif how == "op":
        req["op"] = draw(st.one_of(st.text(max_size=20), json_values))
    elif how == "id":
        req["id"] = draw(st.one_of(json_values, st.integers(min_value=2**63, max_value=2**80)))
    raw = msgspec.json.encode(req)
    if how == "deep":
        depth = draw(st.integers(min_value=50, max_value=200_000))
        key = draw(st.sampled_from(keys))
        raw = raw[:-1] + b',"' + key.encode() + b'":' + b"[" * depth + b"]" * depth + b"}"
    elif how == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
        pos = draw(st.integers(min_value=0, max_value=len(raw)))
        raw = raw[:pos] + bad + raw[pos:]
    elif how == "truncate":
        raw = raw[: draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))]
    elif how == "flip":
        pos = draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw = raw[:pos] + bytes([raw[pos] ^ (1 << draw(st.integers(0, 7)))]) + raw[pos + 1:]
    elif how == "dup":
        raw = raw[:-1] + b"," + raw[1:]  # every key twice
    return raw.replace(b"\n", b" ")


#: anything a client could send as one line
any_line = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ")),
    json_values.map(lambda v: msgspec.json.encode(v)),
    valid_requests.map(msgspec.json.encode),
    mutated_request(),
)
