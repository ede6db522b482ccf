"""Installing the real runtimes from the npm lock files, once, however many processes ask at once.

The tests run in parallel (pytest-xdist workers, and the benchmark's own
process): each install runs ``npm ci`` under a file lock held across processes,
and whoever waited finds it installed. ``npm ci`` starts by deleting
``node_modules``, so two at once in the same folder would break each other
(and a runtime already running from it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TypeVar

HERE = pathlib.Path(__file__).resolve().parent
T = TypeVar("T")


@contextlib.contextmanager
def install_lock(root: pathlib.Path, timeout: float = 1200.0) -> Iterator[None]:
    """Held while ``root`` is checked and installed: one process at a time, per folder.

    The lock file is in the temp dir (named after ``root``), so nothing is left in the checkout.
    """
    from filelock import FileLock

    digest = hashlib.sha256(str(pathlib.Path(root).resolve()).encode()).hexdigest()[:16]
    with FileLock(os.path.join(tempfile.gettempdir(), f"agentd-tests-npm-{digest}.lock"), timeout=timeout):
        yield


def npm_installed(root: pathlib.Path, find: Callable[[], T | None], what: str, timeout: float) -> T:
    """``find()`` under ``root``, after ``npm ci`` there when it finds nothing (under install_lock).

    ``what`` names the package(s) for errors. Raises RuntimeError (with npm's output) when npm
    is missing or fails, or when ``find()`` still finds nothing after it.
    """
    with install_lock(root):
        found = find()
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(f"npm is not installed, so {what} cannot be installed")
        _npm_ci(npm, root, timeout)
        found = find()
        if found is None:
            raise RuntimeError(f"`npm ci` in {root} installed no {what}")
        return found


def _npm_ci(npm: str, root: pathlib.Path, timeout: float) -> None:
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`npm ci` in {root} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")


def native_cli(root: pathlib.Path) -> pathlib.Path | None:
    """The platform binary of @github/copilot under ``root/node_modules``, or None."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(), platform.machine())
    plats = {"linux": ["linux", "linuxmusl"], "darwin": ["darwin"], "win32": ["win32"]}.get(sys.platform, [sys.platform])
    for plat in plats:
        exe = root / "node_modules" / "@github" / f"copilot-{plat}-{arch}" / ("copilot.exe" if sys.platform == "win32" else "copilot")
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    return None


def install_copilot_cli(root: pathlib.Path = HERE) -> pathlib.Path:
    """The installed Copilot CLI binary, running ``npm ci`` in ``root`` first when needed.

    Raises RuntimeError (with npm's output) when npm is missing or fails.
    """
    what = f"Copilot CLI (npm @github/copilot) binary for {sys.platform}/{platform.machine()}"
    return npm_installed(root, lambda: native_cli(root), what, timeout=600)


def codex_native_cli(root: pathlib.Path) -> pathlib.Path | None:
    """The platform binary of @openai/codex under ``root/node_modules``, or None.

    The npm bin (``codex.js``) only spawns it under node; the binary runs on its own.
    """
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine().lower())
    if arch is None or not sys.platform.startswith("linux"):
        return None
    exe = (root / "node_modules" / "@openai" / f"codex-linux-{'x64' if arch == 'x86_64' else 'arm64'}" / "vendor"
           / f"{arch}-unknown-linux-musl" / "bin" / "codex")
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def install_codex_cli(root: pathlib.Path = HERE) -> pathlib.Path:
    """The installed Codex CLI binary (npm @openai/codex, pinned in ``root``'s lock file), after ``npm ci``.

    Raises RuntimeError (with npm's output) when npm is missing or fails.
    """
    what = f"Codex CLI (npm @openai/codex) binary for {sys.platform}/{platform.machine()}"
    return npm_installed(root, lambda: codex_native_cli(root), what, timeout=600)
