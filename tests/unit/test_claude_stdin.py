"""LeanTransport.write (agentd.providers.claude._stdout) against the SDK's own write, on a real
pipe to a stand-in CLI: the same bytes arrive, whole lines never interleave (a line larger than
the pipe's buffer included), and a write to an ended process fails as the SDK's does."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import trio

_CLI = """#!{python}
import os, sys, time
time.sleep(float(os.environ.get("SLEEP", "0")))  # before reading anything: what is written waits in the pipe
out = open(os.environ["OUT"], "wb")
for line in sys.stdin.buffer:
    out.write(line)
    out.flush()
    if line.startswith(b"slow"):
        time.sleep(0.2)  # the pipe fills meanwhile: what comes next is written part by part
    if line.startswith(b"quit"):
        break
"""

_BIG = "big:" + "\u00e9x" * 300_000 + "\n"  # ~900 KB of UTF-8, far over a pipe's 64 KiB


async def _transport(transport_class: Any, tmp_path: pathlib.Path, sleep: float = 0) -> Any:
    from claude_agent_sdk import ClaudeAgentOptions

    from agentd.providers.claude._stdout import _no_prompt

    tmp_path.mkdir()
    cli = tmp_path / "cli"
    cli.write_text(_CLI.format(python=sys.executable))
    cli.chmod(0o755)
    options = ClaudeAgentOptions(cli_path=str(cli), env={"OUT": str(tmp_path / "out"), "SLEEP": str(sleep)})
    transport = transport_class(prompt=_no_prompt(), options=options)
    await transport.connect()
    return transport


async def _written(transport_class: Any, tmp_path: pathlib.Path) -> tuple[bytes, str]:
    """What the stand-in CLI read off its stdin, and what a write after its exit raised."""
    transport = await _transport(transport_class, tmp_path)
    try:
        await transport.write('{"type":"user","text":"caf\u00e9"}\n')
        await transport.write("slow\n")
        async with trio.open_nursery() as nursery:  # two writers at once: each line stays whole
            nursery.start_soon(transport.write, _BIG)
            nursery.start_soon(transport.write, _BIG.replace("big:", "two:"))
        await transport.write("quit\n")
        with trio.fail_after(10):
            await transport._process.wait()
        error = ""
        try:
            await transport.write("after the end\n")
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    finally:
        await transport.close()
    return (tmp_path / "out").read_bytes(), error


async def test_a_line_reaches_the_cli_as_the_sdks_own_write_delivers_it(tmp_path: pathlib.Path) -> None:
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    from agentd.providers.claude._stdout import LeanTransport

    theirs = await _written(SubprocessCLITransport, tmp_path / "sdk")
    ours = await _written(LeanTransport, tmp_path / "lean")
    # The two concurrent lines may come in either order (trio's scheduler picks), each whole.
    assert sorted(ours[0].split(b"\n")) == sorted(theirs[0].split(b"\n")) and ours[1] == theirs[1]
    lines = ours[0].split(b"\n")
    assert lines[0] == '{"type":"user","text":"caf\u00e9"}'.encode() and lines[1] == b"slow"
    assert sorted(lines[2:4]) == sorted([_BIG[:-1].encode(), _BIG.replace("big:", "two:")[:-1].encode()])
    assert lines[4:] == [b"quit", b""]
    assert ours[1].startswith("CLIConnectionError: Cannot write to terminated process"), ours[1]


async def _queued_when_another_task_ran(transport_class: Any, tmp_path: pathlib.Path) -> list[int]:
    """How many bytes were in the CLI's stdin pipe when a task started just before the write ran."""
    import fcntl
    import struct
    import termios

    transport = await _transport(transport_class, tmp_path, sleep=1)
    seen: list[int] = []

    async def other() -> None:
        fd = transport._process.stdin._stream.fileno()
        seen.append(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await transport.write("quit\n")
        with trio.fail_after(10):
            await transport._process.wait()
    finally:
        await transport.close()
    assert (tmp_path / "out").read_bytes() == b"quit\n"
    return seen


async def test_a_line_is_on_the_pipe_before_any_other_task_runs(tmp_path: pathlib.Path) -> None:
    # The point of LeanTransport.write: a prompt is on the pipe before the tasks its turn's start
    # woke (the journaling of its own user item) run; the SDK's write lets them run first.
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    from agentd.providers.claude._stdout import LeanTransport

    assert await _queued_when_another_task_ran(LeanTransport, tmp_path / "lean") == [len(b"quit\n")]
    assert await _queued_when_another_task_ran(SubprocessCLITransport, tmp_path / "sdk") == [0]
