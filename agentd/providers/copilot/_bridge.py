"""The one bridge between trio and the asyncio-only Copilot SDK.

An asyncio event loop runs in a thread of its own; everything the SDK does
(its JSON-RPC client, its event callbacks, our permission and question
handlers) happens on that loop. The trio side talks to it three ways:

* :meth:`AsyncioBridge.run` (trio -> asyncio, awaited): runs a coroutine on
  the loop and waits for it without blocking trio and without a worker
  thread: the asyncio future's done-callback wakes trio through its
  :class:`trio.lowlevel.TrioToken`. Cancelling the trio caller cancels the
  asyncio task and returns at once (the task's own clean-up goes on on the
  loop; nothing waits for it).
* :meth:`AsyncioBridge.call_soon` (any thread -> asyncio, fire and forget):
  schedules a plain function on the loop, e.g. resolving an asyncio future
  that an SDK handler awaits.
* :meth:`AsyncioBridge.to_trio` (asyncio thread -> trio, fire and forget):
  schedules a plain function on the trio loop, in call order. The provider
  delivers every SDK event this way, so all provider state, and every
  ``EventSink.emit`` call, runs on the trio thread: a sink never has to be
  thread-safe.

The bridge never blocks the trio loop: :meth:`start` and :meth:`stop` wait in
trio for the thread with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
import trio

log = structlog.get_logger(__name__)

T = TypeVar("T")


class BridgeClosed(RuntimeError):
    """The bridge is not running (not started yet, or stopped)."""


class AsyncioBridge:
    """An asyncio loop in a dedicated thread, driven from one trio run.

    Start it from trio (:meth:`start`), use it, stop it (:meth:`stop`). One
    bridge serves one trio run: the trio token is taken at :meth:`start`.
    """

    def __init__(self, name: str = "asyncio-bridge") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        #: to_trio callbacks not run yet, and whether a drain of them is scheduled on trio
        self._to_trio: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._drain_scheduled = False

    @property
    def running(self) -> bool:
        return self._loop is not None and not self._closed

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop (for code that already runs on it)."""
        if self._loop is None:
            raise BridgeClosed("the asyncio bridge is not running")
        return self._loop

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    async def start(self) -> None:
        """Start the loop thread; return once the loop runs. Call from trio, once."""
        if self._loop is not None:
            raise RuntimeError("the bridge was already started")
        self._token = trio.lowlevel.current_trio_token()
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                try:
                    _cancel_all(loop)
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.run_until_complete(loop.shutdown_default_executor())
                except Exception:  # pragma: no cover - best effort at exit
                    log.debug("bridge.shutdown_error", exc_info=True)
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        await trio.to_thread.run_sync(ready.wait)

    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs on the loop, stop it and join its thread.

        Idempotent. Waits in a worker thread (never blocks trio), at most
        ``timeout`` seconds; the thread is a daemon, so a wedged SDK call
        cannot keep the process alive.
        """
        if self._loop is None or self._closed:
            self._closed = True
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass  # already closed
        if thread is not None:
            await trio.to_thread.run_sync(thread.join, timeout, abandon_on_cancel=True)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` on the asyncio loop and return its result.

        A checkpoint. Raises what the coroutine raised. If the trio caller
        is cancelled, the asyncio task is cancelled and :class:`trio.Cancelled`
        propagates at once. Raises :class:`BridgeClosed` when the bridge is
        not running.
        """
        loop = self._loop
        token = self._token
        if loop is None or token is None or self._closed:
            raise BridgeClosed("the asyncio bridge is not running")

        async def call() -> T:
            return await fn(*args, **kwargs)

        done = trio.Event()
        try:
            future = asyncio.run_coroutine_threadsafe(call(), loop)
        except RuntimeError as exc:  # the loop closed under us
            raise BridgeClosed(str(exc)) from None

        def wake(_: concurrent.futures.Future[T]) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # Cancelled on the asyncio side (the loop stopped): not a trio cancellation.
            raise BridgeClosed("the asyncio call was cancelled (the bridge stopped)") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the asyncio loop from any thread; dropped if it stopped."""
        loop = self._loop
        if loop is None or self._closed:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # loop closed

    def to_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the trio loop, in call order; dropped once trio ended.

        Safe from any thread. ``fn`` runs as a trio system callback: it must
        be quick, must not raise, and must not await. A burst of calls
        wakes trio once: each wake-up is a syscall during which the other
        thread may take the GIL, and the SDK's thread would then wait for it.
        """
        token = self._token
        if token is None:
            return
        self._to_trio.append((fn, args))
        if self._drain_scheduled:
            return  # the drain scheduled runs it (it clears the flag before it looks)
        self._drain_scheduled = True
        try:
            token.run_sync_soon(self._drain)
        except trio.RunFinishedError:
            self._to_trio.clear()

    def _drain(self) -> None:
        """Run every queued to_trio callback, in order (a trio system callback)."""
        self._drain_scheduled = False
        queue = self._to_trio
        while queue:
            fn, args = queue.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("bridge.trio_callback_failed", callback=getattr(fn, "__qualname__", repr(fn)))


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
