"""Free-form JSON from clients and runtimes is bounded in nesting (contract.MAX_JSON_NESTING).

msgspec and json recurse per level: a value decoded near the interpreter's recursion limit
failed to encode again deeper down the stack (a host-tool call's arguments raised
RecursionError inside the call and kept its slot). What comes in is checked as it is decoded.
"""

from __future__ import annotations

import msgspec
import pytest

from agentd import contract as c
from agentd import runtime_output, wire

LIMIT = c.MAX_JSON_NESTING


def _deep(levels: int, inner: str = "1") -> str:
    return '{"a":' * (levels - 1) + "[" + inner + "]" + "}" * (levels - 1)


def test_nesting_is_counted_in_containers_without_recursing() -> None:
    assert not c.nested_deeper_than(7, 0) and not c.nested_deeper_than("[[[", 0)
    assert not c.nested_deeper_than([[1]], 2) and c.nested_deeper_than([[1]], 1)
    assert c.nested_deeper_than({"x": 1, "y": [{"z": []}]}, 2) and not c.nested_deeper_than({"y": [{"z": []}]}, 4)
    deep: list = []
    for _ in range(50_000):  # far past the recursion limit
        deep = [deep]
    assert c.nested_deeper_than(deep, LIMIT)


@pytest.mark.parametrize("op,field", [("call_host_tool", "arguments"), ("register_tool", "input_schema")])
def test_a_request_whose_free_form_json_nests_past_the_bound_is_invalid(op: str, field: str) -> None:
    head = f'{{"id":5,"op":"{op}","conversation":"c1","name":"t","{field}":'
    ok = wire.decode_request((head + _deep(LIMIT) + "}").encode())
    assert c.nested_deeper_than(getattr(ok, field), LIMIT - 1)
    with pytest.raises(wire.ProtocolError, match=f"{field} nests more than {LIMIT} levels") as refused:
        wire.decode_request((head + _deep(LIMIT + 1) + "}").encode())
    assert refused.value.request_id == 5 and refused.value.code == "invalid"


def test_a_runtime_message_nested_past_the_bound_is_malformed_and_an_unknown_payload_is_left_out() -> None:
    assert runtime_output.decode_json(_deep(LIMIT).encode())
    with pytest.raises(msgspec.DecodeError, match="more than"):
        runtime_output.decode_json(_deep(LIMIT + 1).encode())
    # Many brackets, little nesting: decoded (the count only decides whether to walk).
    assert len(runtime_output.decode_json(("[" + ",".join(["[]"] * 500) + "]").encode())) == 500
    # The slow path (a lone surrogate escape) is bounded the same way.
    with pytest.raises(msgspec.DecodeError, match="more than"):
        runtime_output.decode_json(_deep(LIMIT + 1, '"\\ud83d"').encode())
    deep: list = []
    for _ in range(LIMIT + 5):
        deep = [deep]
    event = runtime_output.unknown("acp:x", "future_kind", {"deep": deep})
    assert event.unknown.type == "future_kind" and "levels deep, left out" in event.unknown.data
    msgspec.json.encode(event)


def test_a_claude_code_stdout_line_nested_past_the_bound_is_a_corrupt_line() -> None:
    from claude_agent_sdk import CLIJSONDecodeError

    from agentd.providers.claude._stdout import _parse

    line = '{"type":"assistant","message":{"content":[{"type":"tool_use","input":%s}]}}'
    assert _parse((line % _deep(LIMIT - 5)).encode())["type"] == "assistant"
    for inner in ("1", '"\\ud83d"'):  # msgspec's path and json's (a lone surrogate escape)
        with pytest.raises(CLIJSONDecodeError) as corrupt:
            _parse((line % _deep(LIMIT, inner)).encode())
        assert "more than" in str(corrupt.value.original_error)
