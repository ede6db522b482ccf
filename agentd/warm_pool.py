"""Warm pool: fresh runtime conversations made ahead of time, so a new conversation's first prompt
does not wait for a runtime to start (``[runtimes] warm = N``).

What it keeps: per provider, up to N conversations opened with ``Provider.open`` (so each has its
runtime started: the Copilot CLI and a session, a Claude Code process, an ACP agent and its
``session/new``, a Codex app-server and its thread), never prompted, all of one *shape*: the
``OpenRequest`` of a new conversation minus its title (workdir, model, effort, context tier, MCP
servers). Rules, and why:

- A pooled conversation serves only a new conversation (no ``conversation_id``) whose shape is
  byte-for-byte the same (its msgspec encoding): a runtime session is bound to its cwd, model and
  MCP servers at creation, so anything else would run the user's prompt in the wrong place.
  A mismatch starts cold (``Provider.open``), as with no pool.
- Taken means gone: a pooled conversation is popped before it is handed over, never returned,
  never offered twice; one that was ever handed to a conversation is never pooled again. Its
  events until then (a fresh session may report its model or context) wait in a holding sink and
  go to the conversation that takes it, in order.
- The shape to keep ready is the last one asked for on that provider (a person runs agents in
  one repository with one model for a while); at start, the default provider's is
  ``[runtimes] warm_workdir``'s, else its newest conversation's. A new shape discards the
  conversations of the old one.
- Refills happen in the background, woken by a take, a miss, or a pooled runtime that exited: no
  timer, no polling, so an idle daemon stays idle. A refill that fails (the runtime is missing,
  signed out, crashing) is retried after ``restart_backoff_initial_s``, doubling up to
  ``restart_backoff_max_s``, three times; then the pool waits for the next conversation on
  that provider.
- Pooled runtimes are the provider's own (started under agentd's keeper, agentd.procs): they
  stop when the provider's ``run()`` is cancelled at shutdown or reload, and the pool closes them
  first (bounded, shielded).

Which providers: the default provider (``[providers] default``) from the start, any other from its
first new conversation on. A pooled conversation that goes unused (shape changed, reload, a clean
stop) was never prompted: it is discarded (:class:`Discardable`: Copilot deletes the session, Claude
and ACP drop agentd's record), so ``import`` lists no empty session; after a SIGKILL, or on an ACP
agent or Codex that keep sessions of their own, such an empty session stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec
import structlog
import trio

from . import contract as c
from .providers._common import runs_under

if TYPE_CHECKING:
    from .conversations import ConversationService
    from .runtimes import Runtimes

log = structlog.get_logger("agentd.warm_pool")

#: events a pooled conversation may report before it is taken; past it the conversation is discarded
HOLD_LIMIT = 1000
#: refill attempts in a row that may fail before the pool waits for the next use
MAX_FAILURES = 3
#: seconds to close the pooled conversations at shutdown or reload
CLOSE_TIMEOUT_S = 5.0


def shape(request: c.OpenRequest) -> c.OpenRequest:
    """What a pooled conversation must share with a new one: ``request`` without id and title."""
    return msgspec.structs.replace(request, conversation_id="", title="")


def _key(request: c.OpenRequest) -> bytes:
    return msgspec.json.encode(shape(request))


@runtime_checkable
class Discardable(Protocol):
    """A provider conversation that can also be deleted from its runtime's store.

    ``discard`` closes it, then deletes what the runtime (and agentd's provider) keep of it. The
    pool calls it only on a conversation it made and never handed out (never prompted), so that
    shutdown, reloads and shape changes leave no empty session for ``import`` to list. Raises
    what ``close`` raises, Closed when the runtime is gone (the empty session then stays).
    """

    async def discard(self) -> None: ...


class _Holding:
    """The EventSink of a pooled conversation: holds its events until a conversation takes it.

    ``emit`` never blocks or raises (the EventSink contract); an ExitEvent while held calls
    ``on_dead``, as does going past HOLD_LIMIT events.
    """

    def __init__(self, on_dead: Callable[[], None]) -> None:
        self.held: list[c.Event] = []
        self.target: c.EventSink | None = None
        self.dead = False
        self._on_dead = on_dead
        #: where the pooled conversation runs, as its provider said (c.EventSink), for the taker's sink
        self._keepers: Callable[[], frozenset[int]] | None = None

    def emit(self, event: c.Event) -> None:
        if self.target is not None:
            self.target.emit(event)
            return
        self.held.append(event)
        if not self.dead and (isinstance(event, c.ExitEvent) or len(self.held) > HOLD_LIMIT):
            self.dead = True
            self._on_dead()

    def runs_under(self, keepers: Callable[[], frozenset[int]]) -> None:
        self._keepers = keepers
        if self.target is not None:
            runs_under(self.target, keepers)

    def bind(self, sink: c.EventSink) -> None:
        """From now on events go to ``sink``, those held first, in order; where the conversation
        runs (``runs_under``) goes with them."""
        if self._keepers is not None:
            runs_under(sink, self._keepers)
        held, self.held = self.held, []
        for event in held:
            sink.emit(event)
        self.target = sink


class _Entry:
    def __init__(self, provider: c.Provider, key: bytes, conv: c.Conversation, holding: _Holding) -> None:
        self.provider = provider
        self.key = key
        self.conv = conv
        self.holding = holding


class _ProviderPool:
    """One provider's pooled conversations and the shape to keep ready."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.target: c.OpenRequest | None = None
        self.entries: list[_Entry] = []
        self.wake = trio.Event()
        self.failures = 0
        #: pooled conversations being opened now (counted against N)
        self.opening = 0
        #: a refill pass runs now
        self.busy = False
        #: set after each refill pass (see WarmPool.settled)
        self.settled = trio.Event()

    def take(self, key: bytes, provider: c.Provider) -> _Entry | None:
        """Pop a live entry of ``key`` made by ``provider``; no checkpoint between looking and popping."""
        for i, entry in enumerate(self.entries):
            if entry.key == key and entry.provider is provider and not entry.holding.dead:
                del self.entries[i]
                return entry
        return None


class WarmPool:
    """The warm pools of every provider of a :class:`~agentd.runtimes.Runtimes`.

    :meth:`run` serves in the runtimes' nursery; :meth:`open` is what the conversation service
    calls instead of ``Provider.open``. ``hint`` (set by the daemon; see :func:`hint_from`) gives a
    provider's starting shape.
    """

    def __init__(self, runtimes: "Runtimes") -> None:
        self.runtimes = runtimes
        self.hint: Callable[[str], c.OpenRequest | None] = lambda name: None
        self._pools: dict[str, _ProviderPool] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def size(self) -> int:
        """N, read from the config each time (a reload may change it)."""
        return self.runtimes.config.runtimes.warm

    def ready(self, name: str) -> int:
        """How many pooled conversations of provider ``name`` are ready to take now."""
        pool = self._pools.get(name)
        return sum(not e.holding.dead for e in pool.entries) if pool else 0

    async def settled(self, name: str) -> None:
        """Return once provider ``name``'s pool has no refill running or pending (tests): full, or
        given up until the next use. Needs :meth:`run` to be running."""
        pool = self._pool(name)
        while pool.wake.is_set() or pool.busy:
            await pool.settled.wait()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pools filled until cancelled; then close every pooled conversation
        (shielded, up to CLOSE_TIMEOUT_S). ``task_status.started()`` at once."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + CLOSE_TIMEOUT_S
                for name in list(self._pools):
                    await self._drop(name)

    def prime(self) -> None:
        """Start filling the default provider's pool with :attr:`hint`'s shape (the daemon calls
        it once the conversation records are loaded). Needs :meth:`run` to be running."""
        default = self.runtimes.config.providers.default
        if self.size <= 0 or default not in self.runtimes.names():
            return
        pool = self._pool(default)
        try:
            pool.target = self.hint(default)
        except Exception:
            log.exception("warm_pool.hint_failed", provider=default)
        if pool.target is not None:
            pool.wake.set()

    def _pool(self, name: str) -> _ProviderPool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = _ProviderPool(name)
            if self._nursery is not None:
                self._nursery.start_soon(self._keep, pool)
        return pool

    async def open(self, name: str, request: c.OpenRequest, sink: c.EventSink) -> c.Conversation:
        """``Provider.open(request, sink)`` of provider ``name``, served from the pool when it can.

        A new conversation (no ``request.conversation_id``) whose shape matches a pooled one takes
        it (logged ``warm_pool.taken``; a title is then set with ``set_title`` where the runtime
        has titles); any other request opens cold (``warm_pool.miss`` with the reason, for new
        ones). Either way the pool learns the shape and refills in the background. Raises what
        ``Runtimes.get`` and ``Provider.open`` raise.
        """
        provider = await self.runtimes.get(name)
        if self.size <= 0 or request.conversation_id or self._nursery is None:
            return await provider.open(request, sink)
        pool = self._pool(name)
        key = _key(request)
        entry = pool.take(key, provider)
        if pool.target is None or _key(pool.target) != key:
            pool.target = shape(request)
        pool.failures = 0  # a use: failed refills may be tried again
        pool.wake.set()
        if entry is None:
            reason = "empty" if not pool.entries and not pool.opening else (
                "filling" if not pool.entries else "shape")
            log.info("warm_pool.miss", provider=name, reason=reason)
            return await provider.open(request, sink)
        entry.holding.bind(sink)
        log.info("warm_pool.taken", provider=name, provider_conversation=entry.conv.id)
        if request.title:
            try:
                await entry.conv.set_title(request.title)
            except c.Unsupported:
                pass  # the daemon's record holds the title
            except Exception as exc:
                log.warning("warm_pool.title_failed", provider=name, error=str(exc))
        return entry.conv

    async def forget(self, names: "set[str] | None" = None) -> None:
        """Close the pooled conversations of ``names`` (None: all), as their provider is replaced
        (agentd.reload); the pools refill from the next use on."""
        for name in list(self._pools) if names is None else [n for n in names if n in self._pools]:
            pool = self._pools[name]
            pool.target = None
            await self._drop(name)

    async def _drop(self, name: str) -> None:
        pool = self._pools[name]
        entries, pool.entries = pool.entries, []
        for entry in entries:
            await self._close(entry, "forgotten")

    @staticmethod
    async def _close(entry: _Entry, why: str) -> None:
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                if isinstance(entry.conv, Discardable):
                    await entry.conv.discard()  # never prompted: leave no empty session to list or import
                else:
                    await entry.conv.close()
        except Exception as exc:
            log.warning("warm_pool.close_failed", provider_conversation=entry.conv.id, error=str(exc))
        log.info("warm_pool.discarded", provider_conversation=entry.conv.id, why=why)

    async def _keep(self, pool: _ProviderPool) -> None:
        """Refill ``pool`` each time it is woken, until cancelled."""
        while True:
            await pool.wake.wait()
            pool.wake = trio.Event()
            pool.busy = True
            try:
                await self._refill(pool)
            finally:
                pool.busy = False
                pool.settled.set()
                pool.settled = trio.Event()

    async def _refill(self, pool: _ProviderPool) -> None:
        target = pool.target
        if target is None:
            return
        key = _key(target)
        for entry in [e for e in pool.entries if e.key != key or e.holding.dead]:
            pool.entries.remove(entry)
            await self._close(entry, "exited" if entry.holding.dead else "shape changed")
        cfg = self.runtimes.config.runtimes
        delay = cfg.restart_backoff_initial_s
        while pool.target is target and len(pool.entries) < self.size and pool.failures < MAX_FAILURES:
            try:
                provider = await self.runtimes.get(pool.name)
                entry = await self._make(pool, provider, target, key)
            except Exception as exc:
                pool.failures += 1
                log.warning("warm_pool.refill_failed", provider=pool.name, error=str(exc), failures=pool.failures)
                if pool.failures < MAX_FAILURES:
                    await trio.sleep(delay)
                    delay = min(delay * 2, cfg.restart_backoff_max_s)
                continue
            if pool.target is not target:  # the shape changed while it opened
                await self._close(entry, "shape changed")
                continue
            pool.entries.append(entry)
            log.info("warm_pool.ready", provider=pool.name, provider_conversation=entry.conv.id,
                     ready=len(pool.entries), size=self.size)

    async def _make(self, pool: _ProviderPool, provider: c.Provider, target: c.OpenRequest, key: bytes) -> _Entry:
        def dead() -> None:
            pool.failures += 1
            log.warning("warm_pool.exited", provider=pool.name, failures=pool.failures)
            pool.wake.set()

        holding = _Holding(dead)
        pool.opening += 1
        try:
            conv = await provider.open(target, holding)
        finally:
            pool.opening -= 1
        return _Entry(provider, key, conv, holding)


def hint_from(service: "ConversationService") -> Callable[[str], c.OpenRequest | None]:
    """A :attr:`WarmPool.hint`: provider name -> the shape its pool starts with.

    ``[runtimes] warm_workdir`` (read at each call) when set: that directory with the provider's
    defaults (its MCP servers as a new conversation there would get them); else the shape of the
    provider's newest conversation on record; None when there is none.
    """
    from . import wire

    def hint(name: str) -> c.OpenRequest | None:
        warm_workdir = service.runtimes.config.runtimes.warm_workdir
        if warm_workdir:
            stand_in = wire.ConversationRecord(id="", provider=name, workdir=warm_workdir, created_at="", updated_at="")
            return c.OpenRequest(workdir=warm_workdir, mcp_servers=service.mcp_servers(stand_in))
        records = [r for r in service.list(include_closed=True) if r.provider == name]
        if not records:
            return None
        r = max(records, key=lambda r: r.created_at)
        return c.OpenRequest(workdir=r.workdir, model=r.model, effort=r.effort, context_tier=r.context_tier,
                             mcp_servers=service.mcp_servers(r))

    return hint
