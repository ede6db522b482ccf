"""A real Copilot turn through agentd, against the same turn driven directly with github-copilot-sdk.

Both sides run the real Copilot CLI (installed from tests/e2e's lock file,
as the e2e tests do) with bring-your-own-key pointed at the scripted model
server of tests/e2e on 127.0.0.1 (a process of its own), answering with
plain streamed text. Each
side has its CLI started and a session open before the clock runs (one
warm-up turn each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives on a subscription (what ``agentctl run`` waits for);
* directly: ``session.send`` until the SDK reports ``session.idle``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ._common import Ctx, Result
from ._turns import (KEY_ENV, MODEL, PROMPT, E2E, Relay, _children, _Cpu, _LoopThread, _ModelServerProcess, _ThroughAgentd,
                     alternate, e2e_path, tree, turn_count, turn_results)


def _cli() -> str:
    e2e_path()
    from conftest import install_copilot_cli  # tests/e2e/conftest.py

    return str(install_copilot_cli(E2E))


def sdk_client(cli: str, home: Path, work: Path) -> Any:
    """A github-copilot-sdk client (not started) for the CLI at ``cli``, its state in ``home``."""
    from copilot import CopilotClient, RuntimeConnection

    return CopilotClient(
        connection=RuntimeConnection.for_stdio(path=cli),
        working_directory=str(work),
        env={k: v for k, v in os.environ.items() if k != KEY_ENV},
        base_directory=str(home),
        use_logged_in_user=False,
        client_info={"application_name": "agentd"},
    )


async def create_session(client: Any, url: str, work: Path, on_event: Callable[[Any], None]) -> Any:
    """A session on ``client`` with the same options as agentd's copilot provider: the same handlers
    (which give the agent the same tools), streaming, a title, bring-your-own-key to ``url``; only
    the callbacks differ."""

    def on_permission(request: Any, invocation: Any) -> Any:
        raise RuntimeError("the bench turn asks no permission")

    async def on_question(*args: Any) -> Any:
        raise RuntimeError("the bench turn asks no question")

    return await client.create_session(
        on_event=on_event,
        on_permission_request=on_permission,
        on_user_input_request=on_question,
        on_elicitation_request=on_question,
        on_exit_plan_mode_request=on_question,
        streaming=True,
        working_directory=str(work),
        client_name="agentd",
        name="bench",
        provider={"type": "openai", "base_url": url, "api_key": os.environ[KEY_ENV]},
        model=MODEL,
    )


class _Direct(_LoopThread):
    """The SDK driven directly, on an asyncio loop in a thread of its own."""

    def __init__(self, cli: str, url: str, home: Path, work: Path, relay: Relay | None = None) -> None:
        super().__init__("bench-copilot-sdk")
        self.cli, self.url, self.home, self.work = relay.cli(cli) if relay else cli, url, home, work
        self.idle: asyncio.Event | None = None
        before = set(_children(os.getpid()))
        self.call(self._start())
        # The CLI the SDK started: the one new child (the sides start one after another).
        new = set(_children(os.getpid())) - before
        self.pid = new.pop() if len(new) == 1 else 0

    async def _start(self) -> None:
        from copilot.generated.session_events import SessionEventType

        self.client = sdk_client(self.cli, self.home, self.work)
        await self.client.start()
        self.idle = asyncio.Event()

        def on_event(event: Any) -> None:
            if event.type is SessionEventType.SESSION_IDLE:
                assert self.idle is not None
                self.idle.set()

        self.session = await create_session(self.client, self.url, self.work, on_event)

    async def _turn(self) -> float:
        assert self.idle is not None
        self.idle.clear()
        t0 = time.perf_counter()
        await self.session.send(PROMPT)
        await self.idle.wait()
        return time.perf_counter() - t0

    def turn(self) -> float:
        return self.call(self._turn())

    def close(self) -> None:
        try:
            self.call(self.client.stop(), timeout=30)
        except Exception:
            pass
        self.stop_loop()


def _agentd_config(cli: str, url: str, home: Path) -> str:
    q = json.dumps
    return ("[providers.copilot]\n"
            f"cli_path = {q(cli)}\ncopilot_home = {q(str(home))}\n"
            "\n[providers.copilot.byok]\n"
            f'type = "openai"\nbase_url = {q(url)}\napi_key_env = {q(KEY_ENV)}\nmodel = {q(MODEL)}\n')


def bench_copilot(ctx: Ctx) -> list[Result]:
    name = "Copilot turn through agentd (real CLI, scripted model)"
    try:
        cli = _cli()
    except Exception as exc:
        reason = f"the Copilot CLI could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return [Result(name, "s", skipped=reason, target="<= 1.02x baseline")]
    turns = turn_count(ctx)
    root = ctx.scratch("copilot")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    cpu = _Cpu()

    ours, base = alternate(root, server, cpu, turns,
                           lambda home, work, **kw: _ThroughAgentd(ctx, work, provider="copilot",
                                                             config=_agentd_config(cli, server.url, home), **kw),
                           lambda home, work, **kw: _Direct(cli, server.url, home, work, **kw),
                           lambda direct, daemon: tree(direct.pid))
    rows = turn_results(ctx, "Copilot", name, ours, base, cpu, direct="the same turn with github-copilot-sdk directly",
                        cli="the Copilot CLI")
    return rows
