"""Supervision of provider runtimes: construction from config, lazy start, restart, shutdown.

Each configured provider runs its ``run()`` in this module's nursery for the
daemon's whole life; the provider starts its runtime process lazily (on the
first ``open`` or ``models``) and stops only what it started when ``run()``
is cancelled. If a provider's ``run()`` itself fails, it is restarted with
exponential backoff; conversations on it see ``closed`` until then. Before
any of that, :meth:`Runtimes.run` ends the runtime processes a previous,
killed instance left running (:func:`agentd.procs.reap_previous`).

A provider is built (its module, and so its SDK, imported) in a worker
thread on first use: github-copilot-sdk and claude-agent-sdk take seconds to
import and tens of MB, which a daemon that never uses them should not pay,
and start-up never waits for them. A request for a provider waits until it
is built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import contract as c
from . import procs, wire

if TYPE_CHECKING:
    from . import agentfs
    from .config import Config

log = structlog.get_logger("agentd.runtimes")

#: How long ``providers`` waits for one provider's check, seconds.
CHECK_TIMEOUT_S = 45.0
#: How long a request waits for a provider that is still being built, seconds.
LOAD_TIMEOUT_S = 60.0


class _Slot:
    """One configured provider: how to build it, and once built, the provider or why it broke."""

    def __init__(self, name: str, factory: Callable[[], c.Provider]) -> None:
        self.name = name
        self.factory = factory
        self.provider: c.Provider | None = None
        self.error = ""
        #: set by the first get(): build it
        self.wanted = trio.Event()
        self.loaded = trio.Event()


class Runtimes:
    """The configured providers, by name."""

    def __init__(self, config: "Config", state_dir: Path, *, files: "agentfs.Policy | None" = None) -> None:
        self.config = config
        self.state_dir = state_dir
        #: agent file access: limits and agentd's own paths (None: the defaults, the state dir refused)
        self.files = files
        self._slots: dict[str, _Slot] = {}
        self._declare()

    def _declare(self) -> None:
        providers = self.config.providers
        state_dir = self.state_dir
        runtimes = self.config.runtimes

        def restart_policy() -> Any:
            from .providers._restart import RestartPolicy

            return RestartPolicy(initial_s=runtimes.restart_backoff_initial_s, max_s=runtimes.restart_backoff_max_s)

        if providers.script.enabled:

            def script() -> c.Provider:
                from .providers.script import ScriptProvider

                return ScriptProvider(providers.script, state_dir=state_dir, name="script")

            self._slots["script"] = _Slot("script", script)

        if providers.copilot.enabled:

            def copilot() -> c.Provider:
                from .providers.copilot import CopilotProvider

                return CopilotProvider(providers.copilot, state_dir=state_dir, name="copilot", restart_policy=restart_policy())

            self._slots["copilot"] = _Slot("copilot", copilot)

        if providers.claude.enabled:

            def claude() -> c.Provider:
                from .providers.claude import ClaudeProvider

                return ClaudeProvider(providers.claude, state_dir=state_dir, name="claude", restart_policy=restart_policy())

            self._slots["claude"] = _Slot("claude", claude)

        if providers.codex.enabled:

            def codex() -> c.Provider:
                from .providers.codex import CodexProvider

                return CodexProvider(providers.codex, state_dir=state_dir, name="codex", restart_policy=restart_policy())

            self._slots["codex"] = _Slot("codex", codex)

        for agent_name, agent in providers.acp.items():
            if not agent.enabled:
                continue
            full = f"acp:{agent_name}"

            def acp(agent: Any = agent, full: str = full) -> c.Provider:
                from .providers.acp import AcpProvider

                return AcpProvider(agent, state_dir=state_dir, name=full, restart_policy=restart_policy(),
                                   files=self.files)

            self._slots[full] = _Slot(full, acp)

    def names(self) -> list[str]:
        return sorted(self._slots)

    async def get(self, name: str) -> c.Provider:
        """The provider ``name``, waiting while it is being built.

        Raises NotFound when it is not configured, RuntimeUnavailable when it
        could not be built (its SDK is missing, say).
        """
        slot = self._slots.get(name)
        if slot is None:
            raise c.NotFound(f"no provider {name!r}; configured: {', '.join(self.names()) or 'none'}")
        slot.wanted.set()
        if not slot.loaded.is_set():
            with trio.move_on_after(LOAD_TIMEOUT_S):
                await slot.loaded.wait()
        if slot.provider is None:
            raise c.RuntimeUnavailable(slot.error or f"provider {name} is still loading")
        return slot.provider

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Build and run every provider until cancelled; restart a provider whose run() failed.

        First ends what runtimes a previous (killed) instance left running (:mod:`agentd.procs`),
        up to its grace when there are any; then ``task_status.started()`` comes at once:
        each provider is built on its first get().
        """
        await trio.to_thread.run_sync(procs.reap_previous, self.state_dir)
        backoff = self.config.runtimes
        async with trio.open_nursery() as nursery:
            for slot in self._slots.values():
                nursery.start_soon(self._supervise, slot, backoff.restart_backoff_initial_s, backoff.restart_backoff_max_s)
            task_status.started()

    async def _supervise(self, slot: _Slot, initial: float, maximum: float) -> None:
        await slot.wanted.wait()
        try:
            # abandon_on_cancel: a shutdown during a slow SDK import does not wait for it
            slot.provider = await trio.to_thread.run_sync(slot.factory, abandon_on_cancel=True)
        except Exception as exc:  # ImportError of an optional SDK, a bad path, ...
            slot.error = f"provider {slot.name} is not available: {type(exc).__name__}: {exc}"
            log.error("provider.unavailable", provider=slot.name, error=slot.error)
            slot.loaded.set()
            return
        delay = initial
        first = True
        while True:
            try:
                if first:
                    first = False
                    await self._run_first(slot)
                else:
                    await slot.provider.run()
                log.warning("provider.stopped", provider=slot.name)
            except Exception:
                log.exception("provider.failed", provider=slot.name, restart_in_s=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, maximum)

    @staticmethod
    async def _run_first(slot: _Slot) -> None:
        assert slot.provider is not None
        provider = slot.provider

        async def run(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await provider.run(task_status=task_status)

        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(run)
            finally:
                slot.loaded.set()

    async def describe(self) -> list[wire.ProviderInfo]:
        """Every provider with its capabilities and whether its runtime is usable now.

        Checks run concurrently, each bounded by CHECK_TIMEOUT_S (a first check
        may start the runtime to learn what it advertises).
        """
        results: dict[str, wire.ProviderInfo] = {}

        async def one(name: str) -> None:
            try:
                provider = await self.get(name)
            except c.AgentdError as exc:
                results[name] = wire.ProviderInfo(name=name, display_name=name, capabilities=c.Capabilities(),
                                                  available=False, error=exc.message)
                return
            error = ""
            with trio.move_on_after(CHECK_TIMEOUT_S) as scope:
                try:
                    await provider.check()
                except c.AgentdError as exc:
                    error = exc.message
                except Exception as exc:  # a provider bug must not break `providers`
                    error = f"{type(exc).__name__}: {exc}"
            if scope.cancelled_caught:
                error = f"the runtime did not answer within {CHECK_TIMEOUT_S:g} s"
            results[name] = wire.ProviderInfo(
                name=name,
                display_name=provider.display_name,
                # agentd's own checkpoints work alike on every provider
                capabilities=msgspec.structs.replace(provider.capabilities(),
                                                     checkpoints=self.config.checkpoints.enabled),
                available=not error,
                error=error,
            )

        async with trio.open_nursery() as nursery:
            for name in self.names():
                nursery.start_soon(one, name)
        return [results[name] for name in self.names()]

    async def models(self, name: str) -> list[c.Model]:
        provider = await self.get(name)
        return await provider.models()
