"""The claude provider's own bookkeeping, below the CLI: how its session records reach the disk
(a change of the running cost alone waits and is coalesced, anything else is written at once, and
nothing waiting is lost at a read, a close or the provider's stop), and the inbox through which the
SDK's stdout reader hands over each CLI message (every one, in order, none held back)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import anyio
import pytest
import trio
import trio.testing

from agentd.config import ClaudeConfig
from agentd.providers.claude import _provider
from agentd.providers.claude._conversation import _Inbox
from agentd.providers.claude._provider import ClaudeProvider, _Record


def _on_disk(provider: ClaudeProvider, sid: str) -> dict[str, Any]:
    return json.loads((provider.dir / f"{sid}.json").read_bytes())


async def _running(nursery: trio.Nursery, tmp_path: pathlib.Path) -> tuple[ClaudeProvider, trio.CancelScope]:
    provider = ClaudeProvider(ClaudeConfig(), state_dir=tmp_path / "state")
    scope = trio.CancelScope()

    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await provider.run(task_status=task_status)

    await nursery.start(serve)
    return provider, scope


async def _until(done: Any) -> None:
    with trio.fail_after(5):
        while not done():
            await trio.sleep(0.01)


@pytest.fixture
def short_delay(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(_provider, "COST_WRITE_DELAY_S", 0.3)
    return 0.3


@pytest.fixture
def long_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_provider, "COST_WRITE_DELAY_S", 3600.0)  # only what must write it does, however loaded the host


async def test_a_cost_change_alone_waits_anything_else_is_written_at_once_with_it(
        tmp_path: pathlib.Path, nursery: trio.Nursery, long_delay: None) -> None:
    provider, _ = await _running(nursery, tmp_path)
    record = _Record(id="a", workdir=str(tmp_path), cost_usd=0.5)
    await provider.save_record(record)
    assert _on_disk(provider, "a")["cost_usd"] == 0.5  # a new record: at once
    for cost in (0.75, 1.0, 1.25):  # turns ending within the delay
        record.cost_usd = cost
        await provider.save_record(record)
        assert _on_disk(provider, "a")["cost_usd"] == 0.5
    record.prompted = True  # anything but the cost: at once, the cost with it
    await provider.save_record(record)
    assert _on_disk(provider, "a") | {"updated_at": ""} == {
        "id": "a", "workdir": str(tmp_path), "cost_usd": 1.25, "prompted": True, "updated_at": ""}
    assert not provider._later
    record.resume_at = "entry-1"
    await provider.save_record(record)
    assert _on_disk(provider, "a")["resume_at"] == "entry-1"


async def test_a_waiting_cost_is_written_once_the_delay_passed(
        tmp_path: pathlib.Path, nursery: trio.Nursery, short_delay: float) -> None:
    provider, _ = await _running(nursery, tmp_path)
    record = _Record(id="e", workdir=str(tmp_path), cost_usd=0.5)
    await provider.save_record(record)
    written = _on_disk(provider, "e")["updated_at"]
    record.cost_usd = 2.0
    await provider.save_record(record)
    await _until(lambda: _on_disk(provider, "e")["cost_usd"] == 2.0)
    assert _on_disk(provider, "e")["updated_at"] != written and not provider._later


async def test_a_waiting_cost_is_written_before_the_record_is_read_on_close_and_at_the_stop(
        tmp_path: pathlib.Path, nursery: trio.Nursery, long_delay: None) -> None:
    provider, stop = await _running(nursery, tmp_path)
    record = _Record(id="b", workdir=str(tmp_path), cost_usd=0.1)
    await provider.save_record(record)
    record.cost_usd = 0.2
    await provider.save_record(record)
    assert _on_disk(provider, "b")["cost_usd"] == 0.1
    read = await provider._read_record("b")  # a reopen, history, a fork
    assert read is not None and read.cost_usd == 0.2 and _on_disk(provider, "b")["cost_usd"] == 0.2
    record.cost_usd = 0.3
    await provider.save_record(record, now=True)  # a conversation's close
    assert _on_disk(provider, "b")["cost_usd"] == 0.3
    record.cost_usd = 0.4
    await provider.save_record(record)
    assert _on_disk(provider, "b")["cost_usd"] == 0.3
    stop.cancel()  # the daemon stops
    with trio.fail_after(5):
        while provider._nursery is not None or provider._later:
            await trio.sleep(0.01)
    assert _on_disk(provider, "b")["cost_usd"] == 0.4


async def test_a_forgotten_record_is_not_written_back_later(
        tmp_path: pathlib.Path, nursery: trio.Nursery, short_delay: float) -> None:
    provider, _ = await _running(nursery, tmp_path)
    record = _Record(id="c", workdir=str(tmp_path), cost_usd=0.1)
    await provider.save_record(record)
    record.cost_usd = 0.2
    await provider.save_record(record)
    await provider.forget_record("c")
    await trio.sleep(short_delay * 3)
    assert not (provider.dir / "c.json").exists()


class _Query:
    """Where the SDK keeps its message stream (``Query._message_send`` / ``_message_receive``)."""

    def __init__(self) -> None:
        self._message_send, self._message_receive = anyio.create_memory_object_stream[dict[str, Any]](100)


class _Client:
    def __init__(self) -> None:
        self._query = _Query()


async def test_the_inbox_hands_over_what_the_stream_held_then_each_message_as_it_is_sent() -> None:
    client = _Client()
    query = client._query
    for n in range(3):  # read before the inbox took the stream's place
        await query._message_send.send({"type": "stream_event", "n": n})
    got: list[int] = []
    inbox = _Inbox.attach(client, lambda message: got.append(message["n"]))
    assert inbox is not None and query._message_send is inbox and got == [0, 1, 2]
    for n in range(3, 6):
        await query._message_send.send({"type": "assistant", "n": n})
        assert got[-1] == n  # handed over within the send: nothing waits for another task
    query._message_send.send_nowait({"type": "end"})
    assert inbox.ended.is_set() and inbox.error is None
    await query._message_send.send({"type": "assistant", "n": 99})  # nothing after the end
    assert got == [0, 1, 2, 3, 4, 5]


async def test_the_inbox_keeps_the_readers_error_and_ends_on_close() -> None:
    client = _Client()
    error = RuntimeError("Command failed with exit code 1")
    await client._query._message_send.send({"type": "assistant", "n": 0})
    await client._query._message_send.send({"type": "error", "error": str(error), "exception": error})
    got: list[int] = []
    inbox = _Inbox.attach(client, lambda message: got.append(message["n"]))
    assert inbox is not None and got == [0] and inbox.ended.is_set() and inbox.error is error

    other = _Client()
    other._query._message_send.close()  # the reader ended before the inbox came: nothing to wait for
    late = _Inbox.attach(other, got.append)
    assert late is not None and late.ended.is_set() and late.error is None
    fresh = _Inbox.attach(_Client(), got.append)
    assert fresh is not None and not fresh.ended.is_set()
    fresh.close()  # the SDK's Query.close
    assert fresh.ended.is_set()


async def test_a_turns_end_starts_a_write_only_for_a_change_other_than_the_cost(
        tmp_path: pathlib.Path, nursery: trio.Nursery, long_delay: None) -> None:
    provider, _ = await _running(nursery, tmp_path)
    record = _Record(id="d", workdir=str(tmp_path), cost_usd=0.1)
    saves: list[float | None] = []

    async def save() -> None:
        saves.append(record.cost_usd)
        await provider.save_record(record)

    provider.save_soon(record, save)  # never written yet: at once
    await _until(lambda: (provider.dir / "d.json").exists())
    assert saves == [0.1] and _on_disk(provider, "d")["cost_usd"] == 0.1
    record.cost_usd = 0.2
    provider.save_soon(record, save)  # the cost alone: no task, left for the later write
    provider.save_soon(record, save)
    await trio.testing.wait_all_tasks_blocked()
    assert saves == [0.1] and provider._later == {"d": record} and _on_disk(provider, "d")["cost_usd"] == 0.1
    record.allowed_tools.append("Bash")
    provider.save_soon(record, save)
    await _until(lambda: "allowed_tools" in _on_disk(provider, "d"))
    assert saves == [0.1, 0.2] and _on_disk(provider, "d")["cost_usd"] == 0.2 and not provider._later


# ---------------------------------------------------------------- the CLI's stdout, read lean

_CLI = """#!{python}
import os, sys, time
chunks = open(os.environ["CHUNKS"], "rb").read().split(b"\\0")
for chunk in chunks:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    time.sleep(0.005)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


async def _read_all(transport_class: Any, tmp_path: pathlib.Path, chunks: list[bytes], exit_code: int = 0,
                    limit: int = 1 << 20) -> tuple[list[Any], str]:
    """Every message ``transport_class`` reads off a stand-in CLI printing ``chunks``, and what it raised."""
    import sys

    from claude_agent_sdk import ClaudeAgentOptions

    from agentd.providers.claude._stdout import _no_prompt

    cli = tmp_path / "cli"
    cli.write_text(_CLI.format(python=sys.executable))
    cli.chmod(0o755)
    (tmp_path / "chunks").write_bytes(b"\0".join(chunks))
    options = ClaudeAgentOptions(cli_path=str(cli), max_buffer_size=limit,
                                 env={"CHUNKS": str(tmp_path / "chunks"), "EXIT": str(exit_code)})
    transport = transport_class(prompt=_no_prompt(), options=options)
    await transport.connect()
    got: list[Any] = []
    error = ""
    try:
        async for message in transport.read_messages():
            got.append(message)
    except Exception as exc:
        cause = str(getattr(exc, "original_error", ""))  # the ceiling's text agentd reads (the rest is json's or msgspec's)
        error = f"{type(exc).__name__} {getattr(exc, 'exit_code', '')} {cause if 'Buffer size' in cause else ''}"
    finally:
        await transport.close()
    return got, error


_STDOUT_CASES = {
    "lines split anywhere, several per chunk, blank and non-JSON ones skipped, CRLF": (
        [b'{"type":"a","n":1}\n{"type":"b","te', b'xt":"h\xc3', b'\xa9llo \\u00e9"}\n\n[SandboxDebug] x\n',
         b'{"type":"c","n":[1,2.5,null,true]}\r\n{"type":"d"}'], 0),
    "what json reads and msgspec does not: a lone surrogate, Infinity": (
        [b'{"type":"a","text":"x\\ud800y"}\n{"type":"b","n":Infinity}\n'], 0),
    "a non-zero exit after the messages": ([b'{"type":"a"}\n', b'{"type":"result"}\n'], 3),
    "a corrupt line": ([b'{"type":"a"}\n{"type":\n', b'{"type":"b"}\n'], 0),
    "a line over the limit": ([b'{"type":"a"}\n', b'{"type":"b","text":"' + b"x" * 3000 + b'"}\n'], 0),
    "a cut-off last line is dropped": ([b'{"type":"a"}\n{"type":"b","te'], 0),
}


@pytest.mark.parametrize("case", list(_STDOUT_CASES))
async def test_the_lean_reader_reads_what_the_sdks_own_reader_reads(case: str, tmp_path: pathlib.Path) -> None:
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    from agentd.providers.claude._stdout import LeanTransport

    chunks, code = _STDOUT_CASES[case]
    (tmp_path / "sdk").mkdir()
    (tmp_path / "lean").mkdir()
    theirs = await _read_all(SubprocessCLITransport, tmp_path / "sdk", chunks, code, limit=2048)
    ours = await _read_all(LeanTransport, tmp_path / "lean", chunks, code, limit=2048)
    assert ours == theirs
    assert theirs[0], "the case reads something"


def test_an_sdk_without_what_the_lean_reader_takes_keeps_its_own_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """claude-agent-sdk is not pinned: a release whose transport lacks one of the private names the
    lean reader uses gets the SDK's own transport (None), not a reader that fails mid-turn."""
    from claude_agent_sdk import ClaudeAgentOptions
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    from agentd.providers.claude import _stdout

    assert isinstance(_stdout.lean_transport(ClaudeAgentOptions(cli_path="/bin/true")), _stdout.LeanTransport)
    monkeypatch.delattr(SubprocessCLITransport, "_check_claude_version")
    assert _stdout.lean_transport(ClaudeAgentOptions(cli_path="/bin/true")) is None
