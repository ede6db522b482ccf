"""An ACP agent (tests/e2e/acp_fake_agent.py) that also answers ``env NAME`` with ``env:NAME=<value>``
from its own environment (``<unset>`` when it has none): what a runtime was started with."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import acp_fake_agent as fake  # noqa: E402


def env(session: str, rid: Any, rest: str) -> bool:
    name = rest.strip()
    fake.say(session, f"env:{name}={os.environ.get(name, '<unset>')}")
    return False


if __name__ == "__main__":
    fake.serve(name="envagent", commands={**fake.COMMANDS, "env": env})
