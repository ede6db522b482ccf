"""Restart backoff for provider runtimes: shared by the copilot, claude and acp providers.

A provider starts its runtime processes lazily and starts one again, on the
next request, after it died. Without a pace, a runtime that dies at once on
every start would be restarted as fast as requests arrive. So, per *slot*
(what the provider restarts: its one shared runtime, or one conversation's
process), after a failure, meaning an unexpected exit or a start that did
not come up, the next start of that slot is held back:

* by ``initial_s`` (1 s) after the first failure, doubling on each further
  failure in a row, up to ``max_s`` (60 s);
* the count starts over when a runtime stayed up at least ``healthy_s``
  (60 s) before it exited (that exit counts as the first), and when the
  provider reports a success (:meth:`RestartBackoff.succeeded`: a turn
  completed, a new conversation opened);
* a request that needs the runtime while the delay runs waits for it when
  the rest is at most ``wait_limit_s`` (10 s). Past that it fails fast with
  :class:`RuntimeRestarting`, whose message says the runtime is restarting,
  after how many failures, the last one's reason, and when (UTC, and in how
  many seconds) the next start is allowed. Nothing is retried by itself: the
  next request after that time starts the runtime.

Times are trio's clock (``trio.current_time``), so the backoff runs on a
``MockClock`` in tests. Everything here runs on the trio thread and never
blocks; :meth:`RestartBackoff.wait` is a plain cancellable sleep.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from ..contract import RuntimeUnavailable

log = structlog.get_logger("agentd.providers.restart")


@dataclass(frozen=True)
class RestartPolicy:
    """How restarts after failures are paced (see the module docstring)."""

    #: delay after the first failure, seconds; doubled on each further failure in a row
    initial_s: float = 1.0
    #: ceiling of that delay
    max_s: float = 60.0
    #: a runtime that ran at least this long before it exited starts the count over
    healthy_s: float = 60.0
    #: a request waits for a delay with at most this much left; past that it fails fast
    wait_limit_s: float = 10.0

    def delay(self, failures: int) -> float:
        """The hold-back after ``failures`` failures in a row (0 for none)."""
        if failures <= 0 or self.initial_s <= 0:
            return 0.0
        return min(self.max_s, self.initial_s * 2.0 ** min(failures - 1, 64))


DEFAULT_POLICY = RestartPolicy()


class RuntimeRestarting(RuntimeUnavailable):
    """The runtime failed and its next start is held back by the restart backoff.

    Wire code ``unsupported`` (as every :class:`RuntimeUnavailable`); ``details``
    carry ``retry_after_s``, ``retry_at`` (ISO 8601, UTC), ``failures`` and
    ``last_error``.
    """


class _Slot:
    __slots__ = ("failures", "not_before", "last_error")

    def __init__(self) -> None:
        self.failures = 0
        self.not_before = 0.0
        self.last_error = ""


class RestartBackoff:
    """The restart backoff of one provider's runtime slots, keyed by a string.

    ``key`` "" is the provider's own slot (its shared runtime, or new
    processes not yet tied to a conversation); any other key is one
    conversation's process (log field ``conversation``). Slots with no failure
    to remember are not kept.

    ``label`` names the runtime for people ("the Copilot CLI", "Claude Code",
    "the acp:gemini agent"); ``log_prefix`` starts the structlog event names
    (``<prefix>.restart_scheduled``, ``.restart_backoff``, ``.restart_deferred``,
    ``.restart_reset``).
    """

    def __init__(self, label: str, *, provider: str, log_prefix: str, policy: RestartPolicy | None = None) -> None:
        self.label = label
        self.provider = provider
        self.log_prefix = log_prefix
        self.policy = policy or DEFAULT_POLICY
        self._slots: dict[str, _Slot] = {}

    # ------------------------------------------------------------------ reading

    def failures(self, key: str = "") -> int:
        """Failures in a row of slot ``key`` (0 when healthy)."""
        slot = self._slots.get(key)
        return slot.failures if slot is not None else 0

    def remaining(self, key: str = "") -> float:
        """Seconds until slot ``key`` may start again (0 when it may now)."""
        slot = self._slots.get(key)
        if slot is None:
            return 0.0
        return max(0.0, slot.not_before - trio.current_time())

    def tracked(self) -> int:
        """How many slots have failures to remember."""
        return len(self._slots)

    # ------------------------------------------------------------------ reporting

    def failed(self, key: str = "", *, uptime: float = 0.0, error: str = "") -> float:
        """Slot ``key``'s runtime exited unexpectedly after ``uptime`` seconds, or did not
        start (``uptime`` 0). Returns the delay before its next start."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        slot.failures = 1 if uptime >= self.policy.healthy_s else slot.failures + 1
        delay = self.policy.delay(slot.failures)
        slot.not_before = trio.current_time() + delay
        slot.last_error = error = _one_line(error)
        log.info(f"{self.log_prefix}.restart_scheduled", provider=self.provider, **self._key_field(key),
                 failures=slot.failures, delay_s=round(delay, 3), uptime_s=round(uptime, 3), error=error)
        return delay

    def explain(self, key: str, error: str) -> None:
        """Give the latest failure of slot ``key`` its reason, once known."""
        slot = self._slots.get(key)
        error = _one_line(error)
        if slot is not None and error:
            slot.last_error = error

    def succeeded(self, key: str = "", *, why: str = "") -> None:
        """The runtime of slot ``key`` works (a turn completed, ...): the count starts over."""
        slot = self._slots.pop(key, None)
        if slot is not None:
            log.info(f"{self.log_prefix}.restart_reset", provider=self.provider, **self._key_field(key),
                     failures=slot.failures, why=why)

    def forget(self, key: str) -> None:
        """Drop slot ``key`` (its conversation was closed)."""
        self._slots.pop(key, None)

    # ------------------------------------------------------------------ gating a start

    async def wait(self, key: str = "", *, limit: float | None = None) -> None:
        """Return once slot ``key`` may start: at once, or after waiting out a delay with at most
        ``limit`` seconds left (default ``policy.wait_limit_s``). Raises :class:`RuntimeRestarting`
        when more is left. Cancellable (it only sleeps)."""
        limit = self.policy.wait_limit_s if limit is None else limit
        while True:
            slot = self._slots.get(key)
            left = slot.not_before - trio.current_time() if slot is not None else 0.0
            if slot is None or left <= 0:
                await trio.lowlevel.checkpoint()
                return
            if left > limit:
                log.warning(f"{self.log_prefix}.restart_deferred", provider=self.provider, **self._key_field(key),
                            failures=slot.failures, retry_after_s=round(left, 3))
                raise self.restarting_error(key, slot, left)
            log.info(f"{self.log_prefix}.restart_backoff", provider=self.provider, **self._key_field(key),
                     failures=slot.failures, wait_s=round(left, 3))
            await trio.sleep(left)

    def restarting_error(self, key: str, slot: _Slot, left: float) -> RuntimeRestarting:
        at = (_dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=left)).replace(microsecond=0)
        who = f"{self.label} of conversation {key}" if key else self.label
        n = slot.failures
        last = f" (last: {slot.last_error})" if slot.last_error else ""
        message = (
            f"{who} is restarting after {n} failure{'s' if n != 1 else ''} in a row{last}; "
            f"its next start is held back until {at:%H:%M:%S} UTC (in {math.ceil(left)} s): retry then"
        )
        return RuntimeRestarting(message, details={
            "retry_after_s": round(left, 3),
            "retry_at": at.isoformat().replace("+00:00", "Z"),
            "failures": n,
            "last_error": slot.last_error,
        })

    @staticmethod
    def _key_field(key: str) -> dict[str, Any]:
        return {"conversation": key} if key else {}


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (runs of whitespace made one space), at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
