"""Claude Code's stdout, read for the SDK with less work per chunk than its own reader does on trio.

The SDK's ``SubprocessCLITransport`` reads the CLI's NDJSON stdout through three
layers (an anyio text stream over anyio's wrapper of trio's ``FdStream``, then a
line framer over ``str``, then ``json.loads``): per chunk a checkpoint, a read
that would block, a wait, a copy and a decode. :class:`LeanTransport` is that
transport with its reading replaced: one wait for the pipe per chunk, lines
split as bytes, each decoded by msgspec. Its ``write`` puts a line on stdin at once
when nobody else is writing (see there). Everything else (the command line, the
process, stderr, closing) is the SDK's. What it yields and raises is what
the SDK's reader yields and raises: the same dicts (json reads what msgspec refuses), ``CLIJSONDecodeError`` for a
corrupt line or one over ``max_buffer_size`` (bytes here, characters there),
``ProcessError`` for a non-zero exit once stdout ended.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
import trio
from claude_agent_sdk import CLIConnectionError, CLIJSONDecodeError, ProcessError
from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

from ... import runtime_output

log = structlog.get_logger(__name__)

_decode = msgspec.json.Decoder().decode
#: bytes read from the pipe at once (what trio's FdStream reads by default)
READ_SIZE = 65536


async def _no_prompt() -> AsyncIterator[dict[str, Any]]:
    """What ``ClaudeSDKClient.connect()`` hands its transport when it gets no prompt."""
    return
    yield {}  # an async generator that never yields


#: what LeanTransport takes of the SDK's transport besides its public methods (this SDK's private
#: names; claude-agent-sdk is not pinned, so a release without them keeps the SDK's own reader)
RELIES_ON = ("_process", "_stdout_stream", "_max_buffer_size", "_exit_error", "_version_checked",
             "_check_claude_version", "_write_lock", "_stdin_stream", "_ready")


def lean_transport(options: Any) -> LeanTransport | None:
    """The transport ``ClaudeSDKClient(options, transport=...)`` gets: the options as connect()
    would pass them to the SDK's own (permission prompts over the control protocol when
    ``can_use_tool`` is set, as ``_configure_can_use_tool`` does). None (the SDK's own
    transport, as the SDK builds it) when this SDK's transport lacks one of :data:`RELIES_ON`."""
    if options.can_use_tool and not options.permission_prompt_tool_name:
        options = dataclasses.replace(options, permission_prompt_tool_name="stdio")
    transport = LeanTransport(prompt=_no_prompt(), options=options)
    missing = [name for name in RELIES_ON if not hasattr(transport, name)]
    if missing:
        log.info("claude.sdk_reader_kept", missing=missing)
        return None
    return transport


class LeanTransport(SubprocessCLITransport):
    """The SDK's subprocess transport reading stdout itself (see the module docstring)."""

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        process = getattr(self, "_process", None)
        pipe = getattr(getattr(process, "stdout", None), "_stream", None)
        if not isinstance(pipe, trio.lowlevel.FdStream):  # not the streams this reads: the SDK's own reader
            return super().read_messages()
        return self._read(pipe)

    async def write(self, data: str) -> None:
        """As the SDK's ``write`` (the same checks, errors and lock), but when nobody else is
        writing, the line goes to the pipe at once, as far as the pipe takes it, not after the
        two scheduler passes the lock and ``send_all`` would take first: a prompt waited there
        behind the journaling of its own turn's start. The rest, if any, goes by ``send_all``.
        Raises CLIConnectionError."""
        lock = self._write_lock
        pipe = getattr(getattr(self._process, "stdin", None), "_stream", None)
        if lock.locked() or not isinstance(pipe, trio.lowlevel.FdStream):
            await super().write(data)
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        lock.acquire_nowait()  # not locked: nobody waits for it either
        try:
            if not self._ready or not self._stdin_stream:
                raise CLIConnectionError("ProcessTransport is not ready for writing")
            if self._process and self._process.returncode is not None:
                raise CLIConnectionError(f"Cannot write to terminated process (exit code: {self._process.returncode})")
            if self._exit_error:
                raise CLIConnectionError(f"Cannot write to process that exited with error: {self._exit_error}") \
                    from self._exit_error
            try:
                line = data.encode()
                try:
                    sent = os.write(pipe.fileno(), line)
                except BlockingIOError:
                    sent = 0
                if sent < len(line):
                    await self._stdin_stream.transport_stream.send(line[sent:])
            except Exception as exc:
                self._ready = False
                self._exit_error = CLIConnectionError(f"Failed to write to process stdin: {exc}")
                raise self._exit_error from exc
        finally:
            lock.release()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def _read(self, pipe: trio.lowlevel.FdStream) -> AsyncIterator[dict[str, Any]]:
        if not self._process or not self._stdout_stream:
            raise CLIConnectionError("Not connected")
        limit = self._max_buffer_size
        pending: list[bytes] = []
        size = 0
        try:
            while True:
                data = await self._chunk(pipe)
                if not data:
                    break
                if b"\n" not in data:
                    pending.append(data)
                    size += len(data)
                    _guard(size, limit)
                    continue
                if pending:
                    pending.append(data)
                    data = b"".join(pending)
                *lines, tail = data.split(b"\n")
                pending, size = ([tail], len(tail)) if tail else ([], 0)
                for line in lines:
                    _guard(len(line), limit)
                    message = _parse(line)
                    if message is not None:
                        if not self._version_checked:
                            self._check_claude_version(message)
                        yield message
                _guard(size, limit)
        except GeneratorExit:
            return  # the reader was closed: no exit status to report
        tail = b"".join(pending)
        try:
            message = _parse(tail)
        except CLIJSONDecodeError:  # cut off mid-write: unrecoverable, as the SDK's reader drops it
            log.debug("claude.truncated_stdout", tail=tail[:200].decode("utf-8", "replace"))
            message = None
        if message is not None:
            yield message
        try:
            code = await self._process.wait()
        except Exception:
            code = -1
        if code is not None and code != 0:
            self._exit_error = ProcessError(f"Command failed with exit code {code}", exit_code=code,
                                            stderr="Check stderr output for details")
            raise self._exit_error

    @staticmethod
    async def _chunk(pipe: trio.lowlevel.FdStream) -> bytes:
        """The next bytes on the pipe, b"" at its end or once it is closed; one wait each."""
        while True:
            fd = pipe.fileno()
            if fd < 0:
                return b""
            try:
                await trio.lowlevel.wait_readable(fd)
                return os.read(fd, READ_SIZE)
            except BlockingIOError:
                continue
            except trio.ClosedResourceError:
                return b""
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    return b""
                raise


def _guard(length: int, limit: int) -> None:
    if length > limit:
        raise CLIJSONDecodeError(f"JSON message exceeded maximum buffer size of {limit} bytes",
                                 ValueError(f"Buffer size {length} exceeds limit {limit}"))


def _parse(line: bytes) -> dict[str, Any] | None:
    """One complete stdout line as a message; None for a blank or non-JSON one (some CLI builds
    print diagnostics there); raises CLIJSONDecodeError for a corrupt one."""
    line = line.strip()
    if not line:
        return None
    if not line.startswith(b"{"):
        log.debug("claude.non_json_stdout", line=line[:200].decode("utf-8", "replace"))
        return None
    try:
        try:
            value = _decode(line)  # an object: it starts with "{"
        except msgspec.DecodeError:
            # What msgspec refuses and json takes (a lone surrogate escaped, NaN, Infinity): read as the SDK reads it.
            value = json.loads(line)
        return runtime_output.within_nesting(line, value)  # contract.MAX_JSON_NESTING, as every runtime's
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CLIJSONDecodeError(line.decode("utf-8", "replace"), exc) from exc
    except (RecursionError, msgspec.DecodeError) as exc:  # nested too deeply: corrupt, not a reader's crash
        raise CLIJSONDecodeError(line[:200].decode("utf-8", "replace"), ValueError(f"nested too deeply: {exc}")) from None
