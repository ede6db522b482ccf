"""``agentctl import`` through a real daemon where no runtime is needed: what is refused, and how."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Daemon


def test_import_is_refused_clearly_where_it_cannot_work_and_creates_nothing(tmp_path: Path, workdir: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        # The script provider keeps no sessions: capability false, op unsupported.
        providers = json.loads(d.agentctl("providers", "--json").stdout)["providers"]
        caps = next(p for p in providers if p["name"] == "script")["capabilities"]
        assert not caps.get("import")
        listing = d.agentctl("import", "-p", "script", "--cwd", str(workdir), "--json")
        assert listing.returncode == 1 and "cannot list or resume" in listing.stderr, listing.stderr
        adopt = d.agentctl("import", "-p", "script", "--cwd", str(workdir), "some-session")
        assert adopt.returncode == 1 and "cannot list or resume" in adopt.stderr, adopt.stderr
        assert d.agentctl("import", "-p", "no-such-provider", "--cwd", str(workdir)).returncode == 6
        usage = d.agentctl("import", "-p", "script", "--force")
        assert usage.returncode == 2 and "--force goes with a SESSION" in usage.stderr
        assert d.agentctl("import", "--cwd", str(workdir)).returncode == 2  # no --provider
        # On the wire: a folder that is not an absolute directory is invalid, before anything else.
        with d.client() as client:
            for bad in ("relative/dir", str(tmp_path / "missing")):
                with pytest.raises(c.Invalid):
                    client.request(wire.ImportList, provider="script", workdir=bad)
                with pytest.raises(c.Invalid):
                    client.request(wire.ImportSession, provider="script", session="s", workdir=bad)
            assert client.request(wire.List) == []
    finally:
        d.stop()
