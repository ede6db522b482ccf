"""Fuzzed agentd.toml: every bad file is a ConfigError naming the key path, never another exception.

Valid configs are generated from the schema (``agentd.config.Config`` as msgspec
sees it), then broken one way: an unknown key in a section, a value of the
wrong type, a number out of its bounds, a key name that breaks its pattern,
or bytes that are not TOML at all.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentd.config import Config, ConfigError, _toml_key, parse_config

from .fuzz import FRAMES, for_type

SCALE = float(os.environ.get("AGENTD_FUZZ_SCALE", "1"))
_mi = msgspec.inspect
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")

#: fields whose values have rules beyond their type (checked in __post_init__)
_SPECIAL: dict[str, st.SearchStrategy[Any]] = {
    "state_dir": st.sampled_from(["", "/tmp/agentd-state", "~/state"]),
    "runtime_dir": st.sampled_from(["", "/run/user/1000/agentd"]),
    "socket": st.sampled_from(["", "~/agentd.sock"]),
    "token_file": st.sampled_from(["", "/tmp/ws-token"]),
    "host": st.sampled_from(["127.0.0.1", "::1", "localhost"]),
    "restart_backoff_initial_s": st.just(1.0),
    "restart_backoff_max_s": st.just(60.0),
}


def _config_strategy(info: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A valid config as a dict: each section sometimes present, each key sometimes set."""
    out: dict[str, st.SearchStrategy[Any]] = {}
    for f in info.fields:
        if f.name in _SPECIAL:
            out[f.encode_name] = _SPECIAL[f.name]
        elif isinstance(f.type, _mi.StructType):
            out[f.encode_name] = _config_strategy(f.type)
        elif isinstance(f.type, _mi.DictType) and isinstance(f.type.value_type, _mi.StructType):
            out[f.encode_name] = st.dictionaries(for_type(f.type.key_type), _config_strategy(f.type.value_type),
                                                 max_size=2)
        elif isinstance(f.type, _mi.UnionType) and any(isinstance(t, _mi.StructType) for t in f.type.types):
            out[f.encode_name] = _config_strategy(next(t for t in f.type.types if isinstance(t, _mi.StructType)))
        else:
            out[f.encode_name] = for_type(f.type)
    required = {f.encode_name: out.pop(f.encode_name) for f in info.fields if f.required}
    return st.fixed_dictionaries(required, optional=out)


CONFIG_INFO = _mi.type_info(Config)
valid_configs = _config_strategy(CONFIG_INFO)


# --------------------------------------------------------------------------- a small TOML writer


def _str(v: str) -> str:
    # A TOML basic string: JSON's escapes, non-ASCII as is (no surrogate pairs), DEL escaped.
    return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _str(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in doc.items() if v is not None)


# --------------------------------------------------------------------------- where things are


def _nodes(doc: Any, info: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, Any, str]]:
    """(path, value, its type, kind) of every struct table and every leaf in ``doc``."""
    out = []
    if isinstance(info, _mi.StructType) and isinstance(doc, dict):
        out.append((path, doc, info, "struct"))
        fields = {f.encode_name: f.type for f in info.fields}
        for k, v in doc.items():
            out.extend(_nodes(v, fields[k], (*path, k)))
    elif isinstance(info, _mi.DictType) and isinstance(doc, dict):
        out.append((path, doc, info, "dict"))
        for k, v in doc.items():
            out.extend(_nodes(v, info.value_type, (*path, k)))
    elif isinstance(info, _mi.UnionType) and isinstance(doc, dict):
        out.extend(_nodes(doc, next(t for t in info.types if isinstance(t, _mi.StructType)), path))
    else:
        out.append((path, doc, info, "leaf"))
    return out


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_toml_key(p) for p in path)  # as ConfigError spells a key path


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


def _wrong_value(t: Any) -> Any:
    if isinstance(t, (_mi.StrType, _mi.LiteralType)):
        return 12345
    if isinstance(t, (_mi.ListType, _mi.DictType)):
        return "not a list"
    return "not a number"


@st.composite
def broken_config(draw: st.DrawFn) -> tuple[str, str]:
    """(TOML text, the dotted key path its error must name)."""
    doc = draw(valid_configs)
    try:
        parse_config(to_toml(doc))
    except ConfigError:
        assume(False)  # breaks a rule already: not a base to break one more way
    doc = json.loads(json.dumps(doc))  # a deep copy
    nodes = _nodes(doc, CONFIG_INFO)
    how = draw(st.sampled_from(["unknown", "type", "bounds", "keyname"]))
    if how == "unknown":
        path, table, info, _ = draw(st.sampled_from([n for n in nodes if n[3] == "struct"]))
        known = {f.encode_name for f in info.fields}
        name = draw(st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(lambda n: n not in known))
        table[name] = draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans()))
        return to_toml(doc), _dotted((*path, name))
    leaves = [n for n in nodes if n[3] == "leaf" and n[0]]
    if how == "bounds":
        bounded = [n for n in leaves if isinstance(n[2], (_mi.IntType, _mi.FloatType))
                   and (n[2].ge is not None or n[2].gt is not None)]
        assume(bounded)
        path, _, t, _ = draw(st.sampled_from(bounded))
        low = t.ge if t.ge is not None else t.gt
        _set(doc, path, int(low) - draw(st.integers(min_value=1, max_value=10**6)))
        return to_toml(doc), _dotted(path)
    if how == "keyname":
        dicts = [n for n in nodes if n[3] == "dict" and isinstance(n[2].key_type, _mi.StrType) and n[2].key_type.pattern]
        assume(dicts)
        path, table, t, _ = draw(st.sampled_from(dicts))
        bad = draw(st.sampled_from(["has space", "1leading-digit", "dot.ted", "ü"]))
        assume(not re.search(t.key_type.pattern, bad))
        value_doc = draw(_config_strategy(t.value_type)) if isinstance(t.value_type, _mi.StructType) else "x"
        table[bad] = value_doc
        return to_toml(doc), _dotted((*path, bad))
    assume(leaves)
    path, _, t, _ = draw(st.sampled_from(leaves))
    if isinstance(t, _mi.AnyType):
        assume(False)
    _set(doc, path, _wrong_value(t))
    return to_toml(doc), _dotted(path)


@settings(max_examples=int(150 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(doc=valid_configs)
def test_configs_shaped_like_the_schema_load_or_name_the_rule_they_break(doc: dict[str, Any]) -> None:
    FRAMES["config: schema-shaped"] += 1
    try:
        parse_config(to_toml(doc))
    except ConfigError as exc:
        # A rule beyond the types (a relative path, max < initial): named by its own key.
        assert exc.key and "." in exc.key, str(exc)
        first = exc.key.split(".")[-1]
        # or a value that must name something that exists (config._check_references): a provider, a MIME type
        names = exc.key.startswith(("budgets.", "tasks.provider_concurrency.", "providers.default",
                                    "attachments.allowed_types[", "mcp.defaults."))
        # or a rule of one [mcp.servers.<name>] table as a whole (command or url): the key names the server
        names = names or (exc.key.startswith("mcp.servers.") and exc.key.count(".") == 2)
        assert exc.reason.startswith(first) or "loopback" in exc.reason or names, str(exc)


@settings(max_examples=int(600 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=broken_config())
def test_every_broken_config_is_a_config_error_naming_the_key(case: tuple[str, str]) -> None:
    FRAMES["config: broken"] += 1
    text, key = case
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert err.value.key == key, f"{err.value} (wanted the key {key})"
    assert str(err.value).startswith(f"config: {'unknown key ' if 'unknown' in str(err.value) else ''}{key}")


@settings(max_examples=int(1000 * SCALE), deadline=None)
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_any_bytes_load_or_fail_with_a_config_error(raw: bytes | str) -> None:
    FRAMES["config: random bytes"] += 1
    try:
        parse_config(raw)
    except ConfigError as exc:
        assert str(exc).startswith("config")
        assert exc.line is not None or exc.key or "TOML" in exc.reason or "UTF-8" in exc.reason or exc.reason
