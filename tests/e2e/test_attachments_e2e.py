"""Attachments on the real runtimes, offline against the scripted model server.

The daemon hands a provider each stored file as ``Prompt.attachments`` with
its ``path``. Copilot takes files by path (the CLI tags them for the model);
Claude Code gets images inline as image blocks and every file named by its
path after the prompt text.
"""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import struct
import zlib
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd.providers.claude import bundled_cli
from modelserver import ModelServer
from environment import unavailable
from test_claude_provider import ListSink as ClaudeSink
from test_claude_provider import claude_config_for
from test_claude_provider import start_provider as start_claude
from test_copilot_provider import ListSink as CopilotSink
from test_copilot_provider import start_provider as start_copilot

pytestmark = pytest.mark.e2e


def tiny_png() -> bytes:
    """A valid 1x1 white PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\xff\xff")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def stored(tmp_path: pathlib.Path, name: str, data: bytes, mime: str) -> c.Attachment:
    """A file as the daemon stores it, and the Attachment it hands the provider."""
    ident = "0123456789abcdef"
    path = tmp_path / "attachments" / f"{ident}-{name}"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return c.Attachment(name=name, mime=mime, size=len(data), id=ident, path=str(path))


async def test_copilot_takes_a_file_by_the_path_of_its_stored_copy(
    copilot_config: Any, model_server: ModelServer, workdir: pathlib.Path, tmp_path: pathlib.Path,
    nursery: trio.Nursery,
) -> None:
    provider, _ = await start_copilot(nursery, copilot_config, tmp_path / "state")
    assert provider.capabilities().attachments
    model_server.answer_text_only("I read the notes.")
    notes = stored(tmp_path, "notes.txt", b"remember the milk\n", "text/plain")
    sink = CopilotSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="What is in the notes?", attachments=[notes]))
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    # The CLI tagged the file for the model by its path; the agent reads it with its tools.
    sent = json.dumps(model_server.model_requests[-1]["messages"])
    assert notes.path in sent
    [user] = sink.items(c.ItemKind.USER)
    assert [(a.name, a.path) for a in user.attachments] == [("notes.txt", notes.path)]
    await conv.close()


async def test_claude_gets_images_inline_and_every_file_by_path(
    model_server: ModelServer, workdir: pathlib.Path, tmp_path: pathlib.Path, model_key_env: str,
    nursery: trio.Nursery,
) -> None:
    cli = bundled_cli() or shutil.which("claude")
    if not cli:
        unavailable("Claude Code is not installed: `pip install claude-agent-sdk` (its wheel bundles the binary)")
    provider, _ = await start_claude(nursery, claude_config_for(cli, model_server, tmp_path, model_key_env),
                                     tmp_path / "state")
    assert provider.capabilities().attachments
    model_server.answer_text_only()
    png = tiny_png()
    image = stored(tmp_path, "dot.png", png, "image/png")
    notes = stored(tmp_path, "notes.txt", b"remember the milk\n", "text/plain")
    sink = ClaudeSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Look at these.", attachments=[image, notes]))
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn

    messages = model_server.model_requests[-1]["messages"]
    blocks = [b for m in messages if m["role"] == "user" and isinstance(m["content"], list) for b in m["content"]]
    images = [b for b in blocks if b.get("type") == "image"]
    assert images and images[0]["source"]["media_type"] == "image/png"
    assert base64.b64decode(images[0]["source"]["data"]) == png
    text = json.dumps(messages)
    assert "Look at these." in text and notes.path in text and image.path in text
    [user] = sink.items(c.ItemKind.USER)
    assert user.text == "Look at these." and [a.name for a in user.attachments] == ["dot.png", "notes.txt"]
    await conv.close()
