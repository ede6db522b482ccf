"""fs/read_text_file and fs/write_text_file: ACP's file requests, served by :mod:`agentd.agentfs`.

agentfs does the confinement (pinned workdir, regular files only, size and
time bounds, agentd's own directories refused); this module only converts
between ACP's params and results and agentfs's errors. An
:class:`agentfs.Refused` (outside the workdir, a symlink, agentd's own files)
is left to the caller, which journals it as a notice; every other failure
becomes the JSON-RPC error answered to the agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import msgspec

from ... import agentfs
from . import _schema as s
from .._jsonrpc import RpcError


async def read_text_file(files: agentfs.Workdir, params: Any, *, missing_file: Literal["error", "empty"]) -> dict:
    """Answer ``fs/read_text_file``. Raises agentfs.Refused, RpcError."""
    req = msgspec.convert(params, s.ReadTextFileRequest)
    try:
        with _answers("read", req.path):
            return {"content": await files.read_text(req.path, req.line, req.limit)}
    except FileNotFoundError:
        if missing_file == "empty":
            return {"content": ""}
        raise RpcError(s.RESOURCE_NOT_FOUND, f"Resource not found: {req.path}", {"uri": req.path}) from None


async def write_text_file(files: agentfs.Workdir, params: Any) -> dict:
    """Answer ``fs/write_text_file``. Raises agentfs.Refused, RpcError."""
    req = msgspec.convert(params, s.WriteTextFileRequest)
    with _answers("write", req.path):
        await files.write_text(req.path, req.content)
    return {}


@contextmanager
def _answers(verb: str, path: str) -> Iterator[None]:
    """agentfs errors other than Refused (and FileNotFoundError) as the RpcError answered to the agent."""
    try:
        yield
    except (agentfs.Refused, FileNotFoundError):
        raise
    except agentfs.TimedOut as exc:
        raise RpcError(s.INTERNAL_ERROR, str(exc), {"path": path}) from None
    except agentfs.FileAccessError as exc:
        raise RpcError(s.INVALID_PARAMS, str(exc), {"path": path}) from None
    except OSError as exc:
        raise RpcError(s.INTERNAL_ERROR, f"cannot {verb} {path}: {exc.strerror or exc}", {"path": path}) from None
