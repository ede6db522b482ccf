"""Supervision of provider runtimes: construction from config, lazy start, warm pool, restart, shutdown.

Each configured provider runs its ``run()`` in this module's nursery for the
daemon's whole life; the provider starts its runtime process lazily (on the
first ``open`` or ``models``) and stops only what it started when ``run()``
is cancelled. If a provider's ``run()`` itself fails, it is restarted with
exponential backoff; conversations on it see ``closed`` until then. Before
any of that, :meth:`Runtimes.run` ends the runtime processes a previous,
killed instance left running (:func:`agentd.procs.reap_previous`).

With ``[runtimes] warm`` > 0, :attr:`Runtimes.warm` (agentd.warm_pool) keeps
fresh runtime conversations ready; conversations open through
:meth:`Runtimes.open`, which takes one of them when it fits.

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

import structlog
import trio

from . import contract as c
from . import procs, wire
from .warm_pool import WarmPool

if TYPE_CHECKING:
    from . import agentfs
    from .config import Config

log = structlog.get_logger("agentd.runtimes")

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
        #: cancelled when a reload replaces this provider (agentd.reload): its run() stops its runtimes
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()


class Runtimes:
    """The configured providers, by name."""

    def __init__(self, config: "Config", state_dir: Path, *, files: "agentfs.Policy | None" = None) -> None:
        self.config = config
        self.state_dir = state_dir
        #: agent file access: limits and agentd's own paths (None: the defaults, the state dir refused)
        self.files = files
        #: the agentd.toml loaded (None: the default path), named in fixes (agentd.accounts)
        self.config_path: Path | None = None
        self._slots: dict[str, _Slot] = {}
        self._nursery: trio.Nursery | None = None
        #: fresh conversations made ahead of time ([runtimes] warm)
        self.warm = WarmPool(self)
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

    def pick(self, name: str) -> str:
        """``name``, or for "" the config's ``[providers] default``; raises Invalid when neither is set."""
        if name:
            return name
        if self.config.providers.default:
            return self.config.providers.default
        raise c.Invalid("no provider given and agentd.toml sets no [providers] default: "
                        f"give -p NAME (configured: {', '.join(self.names()) or 'none'})")

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
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for slot in self._slots.values():
                self._start(slot)
            await nursery.start(self.warm.run)
            task_status.started()

    def _start(self, slot: _Slot) -> None:
        assert self._nursery is not None
        backoff = self.config.runtimes
        self._nursery.start_soon(self._supervise, slot, backoff.restart_backoff_initial_s, backoff.restart_backoff_max_s)

    async def replace(self, config: "Config", names: "set[str] | None" = None, *, grace_s: float = 10.0) -> None:
        """Take ``config``'s providers from now on (agentd.reload): the providers ``names`` (None: all)
        are declared anew, so runtimes they start afterwards get their new settings and the
        environment agentd has now; a provider the config no longer has goes, a new one comes.

        Requests from now on get the new providers; their pooled conversations (agentd.warm_pool) are
        closed, and the default provider's pool refills; the old ones' ``run()`` is cancelled, which stops
        the runtimes they started; waits for that up to ``grace_s``. Call it once their conversations
        are closed (ConversationService.detach). Needs :meth:`run` to be running.
        """
        self.config = config
        kept, self._slots = self._slots, {}
        self._declare()  # into self._slots: the new config's providers
        fresh, self._slots = self._slots, kept
        names = set(fresh) | set(self._slots) if names is None else set(names)
        old = [self._slots.pop(n) for n in names if n in self._slots]
        await self.warm.forget({slot.name for slot in old})
        for name in sorted(names):
            if name in fresh:
                self._slots[name] = fresh[name]
                self._start(fresh[name])
        for slot in old:
            slot.scope.cancel()
        with trio.move_on_after(grace_s):
            for slot in old:
                await slot.stopped.wait()
        self.warm.prime()  # the default provider's pool, refilled on its new provider

    async def _supervise(self, slot: _Slot, initial: float, maximum: float) -> None:
        try:
            with slot.scope:
                await self._supervised(slot, initial, maximum)
        finally:
            slot.stopped.set()

    async def _supervised(self, slot: _Slot, initial: float, maximum: float) -> None:
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

    async def open(self, name: str, request: c.OpenRequest, sink: c.EventSink) -> c.Conversation:
        """Provider ``name``'s ``open(request, sink)``, taking a pooled conversation when one fits
        (see agentd.warm_pool). Raises what :meth:`get` and ``Provider.open`` raise."""
        return await self.warm.open(name, request, sink)

    async def can_run(self, name: str) -> None:
        """Return when provider ``name`` can run a turn now: its state is ``available`` (its runtime
        is there and it is signed in or has its key; agentd.accounts decides).

        Raises NotFound (not configured), RuntimeUnavailable naming the state and the command that
        fixes it (the checks are bounded by agentd.accounts.CHECK_TIMEOUT_S).
        """
        from .accounts import describe

        info = (await describe(self, name))[0]
        if info.state != "available":
            why = f": {info.error}" if info.error else ""
            fix = f"; fix: {info.fix}" if info.fix else ""
            raise c.RuntimeUnavailable(f"provider {name} cannot run a turn ({info.state}){why}{fix}")

    async def describe(self) -> list[wire.ProviderInfo]:
        """Every provider with its state, fix, capabilities and account (see agentd.accounts.describe)."""
        from .accounts import describe

        return await describe(self)

    async def models(self, name: str) -> list[c.Model]:
        provider = await self.get(name)
        return await provider.models()
