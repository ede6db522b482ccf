"""Supervision of provider runtimes: construction from config, lazy start, restart, shutdown.

Each configured provider runs its ``run()`` in this module's nursery for the
daemon's whole life; the provider starts its runtime process lazily (on the
first ``open`` or ``models``) and stops only what it started when ``run()``
is cancelled. If a provider's ``run()`` itself fails, it is restarted with
exponential backoff; conversations on it see ``closed`` until then.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from . import contract as c
from . import wire

if TYPE_CHECKING:
    from .config import Config

log = structlog.get_logger("agentd.runtimes")

#: How long ``providers`` waits for one provider's check, seconds.
CHECK_TIMEOUT_S = 10.0


class Runtimes:
    """The configured providers, by name."""

    def __init__(self, config: "Config", state_dir: Path) -> None:
        self.config = config
        self.state_dir = state_dir
        self._providers: dict[str, c.Provider] = {}
        #: providers that are configured but could not be built, with the reason
        self._broken: dict[str, str] = {}
        self._build()

    def _build(self) -> None:
        providers = self.config.providers
        if providers.script.enabled:
            from .providers.script import ScriptProvider

            self._providers["script"] = ScriptProvider(providers.script, state_dir=self.state_dir, name="script")
        if providers.copilot.enabled:
            try:
                from .providers.copilot import CopilotProvider
            except ImportError as exc:
                self._broken["copilot"] = f"the copilot provider needs github-copilot-sdk ({exc})"
            else:
                self._providers["copilot"] = CopilotProvider(
                    providers.copilot, state_dir=self.state_dir, name="copilot"
                )
        for name, agent in getattr(providers, "acp", {}).items():
            if not agent.enabled:
                continue
            full = f"acp:{name}"
            try:
                from .providers.acp import AcpProvider
            except ImportError as exc:
                self._broken[full] = f"the acp provider is not available ({exc})"
            else:
                self._providers[full] = AcpProvider(agent, state_dir=self.state_dir, name=full)

    def names(self) -> list[str]:
        return sorted([*self._providers, *self._broken])

    def get(self, name: str) -> c.Provider:
        """The provider ``name``; NotFound when not configured, RuntimeUnavailable when broken."""
        provider = self._providers.get(name)
        if provider is not None:
            return provider
        if name in self._broken:
            raise c.RuntimeUnavailable(self._broken[name])
        raise c.NotFound(f"no provider {name!r}; configured: {', '.join(self.names()) or 'none'}")

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run every provider until cancelled; restart a provider whose run() failed."""
        backoff = self.config.runtimes
        async with trio.open_nursery() as nursery:
            for name, provider in self._providers.items():
                await nursery.start(self._supervise, name, provider, backoff.restart_backoff_initial_s, backoff.restart_backoff_max_s)
            task_status.started()

    async def _supervise(self, name: str, provider: c.Provider, initial: float, maximum: float, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        delay = initial
        first = True
        while True:
            try:
                if first:
                    first = False
                    await provider.run(task_status=task_status)
                else:
                    await provider.run()
                log.warning("provider.stopped", provider=name)
            except Exception:
                log.exception("provider.failed", provider=name, restart_in_s=delay)
            self._broken.pop(name, None)
            await trio.sleep(delay)
            delay = min(delay * 2, maximum)

    async def describe(self) -> list[wire.ProviderInfo]:
        """Every provider with its capabilities and whether its runtime is usable now."""
        out: list[wire.ProviderInfo] = []
        for name in self.names():
            provider = self._providers.get(name)
            if provider is None:
                out.append(
                    wire.ProviderInfo(name=name, display_name=name, capabilities=c.Capabilities(), available=False, error=self._broken[name])
                )
                continue
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
            out.append(
                wire.ProviderInfo(
                    name=name,
                    display_name=provider.display_name,
                    capabilities=provider.capabilities(),
                    available=not error,
                    error=error,
                )
            )
        return out

    async def models(self, name: str) -> list[c.Model]:
        provider = self.get(name)
        return await provider.models()
