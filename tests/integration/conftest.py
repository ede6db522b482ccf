from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_harness import REPO, Daemon

SCRIPTS = Path(__file__).parent / "scripts"
DEMO = REPO / "conf" / "demo.toml"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A real agentd process on a temp socket and state dir, stopped after the test."""
    d = Daemon(tmp_path).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w
