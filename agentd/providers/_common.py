"""Small helpers shared by the providers (most by those speaking JSON over a runtime's stdio: acp, codex).

Import-light and importing no provider: providers are built at once in worker
threads, and one provider package importing another could see it half-initialized.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import msgspec
import trio

#: Tool input and output are display text, cut to this many characters.
MAX_TOOL_TEXT = 16 * 1024


def bound(text: str, limit: int = MAX_TOOL_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"\n[{len(text) - limit + 40} more characters cut]"


def render_input(raw: Any, limit: int | None = MAX_TOOL_TEXT) -> str:
    """A tool's input for display: a shell command as is, anything else as compact JSON.

    Cut to ``limit`` characters (:func:`bound`); ``None``: whole.
    """
    def cut(text: str) -> str:
        return text if limit is None else bound(text, limit)

    if raw is msgspec.UNSET or raw is None:
        return ""
    if isinstance(raw, str):
        return cut(raw)
    if isinstance(raw, dict):
        for key in ("command", "cmd"):
            if isinstance(raw.get(key), str) and raw[key]:
                return cut(raw[key])
        if not raw:
            return ""
    try:
        return cut(json.dumps(raw, ensure_ascii=False, separators=(", ", ": ")))
    except (TypeError, ValueError):
        return cut(str(raw))


def runs_under(sink: Any, keepers: Callable[[], frozenset[int]]) -> None:
    """Tell agentd which keepers' processes (agentd.procs) act for the conversation ``sink``
    reports for: ``keepers()``, read at each host tool request from an agent's processes
    (agentd.agent_peers), returns the pids of the keepers its runtime runs under now (empty when
    none runs). Call it before the runtime is handed the conversation's MCP servers: agentd's
    relay among them connects as soon as the runtime starts it. A sink without ``runs_under``
    (a test's) is left alone."""
    bind = getattr(sink, "runs_under", None)
    if bind is not None:
        bind(keepers)


def keeper_set(pid: int | None) -> frozenset[int]:
    """``{pid}``, or empty for None: the keepers of a runtime process agentd started (its pid is
    its keeper's, agentd.procs.launch_argv and launch_script)."""
    return frozenset() if pid is None else frozenset((pid,))


async def check_workdir(workdir: str) -> str:
    """The absolute path of ``workdir``; raises Invalid when it is empty or not a directory."""
    from ..contract import Invalid

    if not workdir:
        raise Invalid("a workdir is required")
    path = os.path.abspath(os.path.expanduser(workdir))
    if not await trio.to_thread.run_sync(os.path.isdir, path):
        raise Invalid(f"workdir {workdir!r} is not a directory")
    return path


def agentd_version() -> str:
    """agentd's version (``agentd.__version__``), for a runtime's clientInfo."""
    from agentd import __version__

    return __version__


def unused_steer(item_id: str, text: str) -> Any:
    """The notice item saying that a steer the runtime accepted was not used by the turn's end
    (the contract's rule for ``steer``); ``text`` is the steer, shown cut to 200 characters."""
    from ..contract import Item, ItemKind, utcnow

    shown = text if len(text) <= 200 else text[:199] + "…"
    return Item(id=item_id, kind=ItemKind.NOTICE, time=utcnow(),
                text=f"The turn ended before the runtime used this steer; it was not delivered: {shown}")
