"""The live view on real runtimes: a running command's output on agentctl's terminal before it ends.

Codex (`codex app-server`) and GitHub Copilot CLI report a running shell
command's output as it comes (``item/commandExecution/outputDelta``,
``tool.execution_partial_result``); agentd journals the running item with its
newest lines (``ToolCall.tail``) and agentctl at a terminal redraws them in
place. Real agentctl on a pseudo-terminal (tests/terminal.py), a real daemon,
the real runtime; only the model is scripted.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from daemon_harness import Daemon
from terminal import Term
from runtimes_e2e import CodexRuntime, CopilotRuntime, Runtime

pytestmark = pytest.mark.e2e

SLOW = "for i in 1 2 3 4 5 6 7 8; do echo live-step-$i; sleep 0.6; done; echo live-done"


@pytest.fixture(params=["codex", "copilot"])
def runtime(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Runtime]:
    rt: Runtime = CodexRuntime(tmp_path) if request.param == "codex" else CopilotRuntime(tmp_path)
    try:
        yield rt
    finally:
        rt.close()


def test_a_running_commands_output_shows_before_it_ends(runtime: Runtime, tmp_path: pathlib.Path) -> None:
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", runtime.config_toml, env=runtime.env).start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    try:
        runtime.call_tool(SLOW)
        t = Term(d, "run", "-p", runtime.provider, "--cwd", str(workdir), "--yolo", "go")
        seen = t.wait_for(lambda s: "│ live-step-3" in s, timeout=90)
        assert "│ live-done" not in seen and "completed" not in seen, seen  # the command still runs
        assert " running · " in seen, seen  # the spinner, with the elapsed time
        assert t.wait_exit(120) == 0, t.text()
        final = t.text()
        assert "│ live-step" not in final and "running ·" not in final, final
        assert "✓ turn completed · " in final, final
    finally:
        d.stop()
