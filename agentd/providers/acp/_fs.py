"""fs/read_text_file and fs/write_text_file, confined to a conversation's workdir.

A path is resolved the way the kernel would open it (symlinks followed,
``..`` applied) before it is compared with the resolved workdir, so neither a
symlink inside the workdir pointing out nor a ``..`` escape gets through.
These functions block on the disk: call them through ``trio.to_thread``.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutsideWorkdir(Exception):
    """The path resolves outside the workdir; ``resolved`` is where it points."""

    def __init__(self, path: str, resolved: str, root: str) -> None:
        super().__init__(f"{path} resolves to {resolved}, outside the conversation's workdir {root}")
        self.path = path
        self.resolved = resolved
        self.root = root


def confine(path: str, workdir: str) -> Path:
    """The real path ``path`` names (relative paths are taken from ``workdir``).

    Raises OutsideWorkdir when it is not ``workdir`` itself or below it.
    """
    root = os.path.realpath(workdir)
    candidate = path if os.path.isabs(path) else os.path.join(root, path)
    real = os.path.realpath(candidate)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise OutsideWorkdir(path, real, root)
    return Path(real)


def read_text(path: Path, line: int | None = None, limit: int | None = None) -> str:
    """The file's text (UTF-8, undecodable bytes replaced), from 1-based ``line``, at most ``limit`` lines.

    Raises FileNotFoundError, IsADirectoryError, PermissionError.
    """
    text = path.read_bytes().decode("utf-8", "replace")
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max((line or 1) - 1, 0)
    end = None if limit is None else start + max(limit, 0)
    return "".join(lines[start:end])


def write_text(path: Path, content: str, workdir: str) -> None:
    """Write ``content`` (UTF-8) to ``path``, creating missing parent directories inside ``workdir``."""
    parent = path.parent
    if not parent.exists():
        confine(str(parent), workdir)
        parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(content)
