"""The restart backoff shared by the runtime providers (agentd.providers._restart), on trio's MockClock."""

from __future__ import annotations

import pytest
import trio

from agentd import contract as c
from agentd import wire
from agentd.providers._restart import DEFAULT_POLICY, RestartBackoff, RestartPolicy, RuntimeRestarting


def backoff(**policy: float) -> RestartBackoff:
    return RestartBackoff("the test agent", provider="acp:test", log_prefix="test", policy=RestartPolicy(**policy))


def test_the_default_policy_is_1_s_doubling_to_60_s_reset_after_60_s_up_waiting_at_most_10_s() -> None:
    assert DEFAULT_POLICY == RestartPolicy(initial_s=1.0, max_s=60.0, healthy_s=60.0, wait_limit_s=10.0)
    assert [DEFAULT_POLICY.delay(n) for n in range(0, 9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert DEFAULT_POLICY.delay(10_000) == 60  # no overflow however long it keeps failing
    assert RestartPolicy(initial_s=0).delay(5) == 0  # initial 0: no backoff at all


async def test_failures_in_a_row_double_the_delay_up_to_the_ceiling(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    delays = [b.failed(uptime=0.5, error=f"exit {n}") for n in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    assert b.failures() == 8
    assert b.remaining() == pytest.approx(60)


async def test_a_runtime_that_stayed_up_long_enough_starts_the_count_over(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    for _ in range(4):
        b.failed()
    assert b.failures() == 4
    assert b.failed(uptime=60.0) == 1  # healthy for 60 s: this exit is the first again
    assert b.failures() == 1
    assert b.failed(uptime=59.0) == 2


async def test_a_success_starts_the_count_over_and_forgets_the_slot(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    b.failed("conv-1")
    b.failed("conv-1")
    assert b.failures("conv-1") == 2 and b.tracked() == 1
    b.succeeded("conv-1", why="a turn completed")
    assert b.failures("conv-1") == 0 and b.remaining("conv-1") == 0 and b.tracked() == 0
    assert b.failed("conv-1") == 1


async def test_slots_are_independent(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    b.failed("a")
    b.failed("a")
    b.failed("a")
    assert b.remaining("a") == pytest.approx(4)
    assert b.remaining("b") == 0 and b.remaining() == 0
    t0 = trio.current_time()
    await b.wait("b")  # another conversation starts at once
    await b.wait()
    assert trio.current_time() == t0


async def test_wait_sleeps_out_a_short_delay(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    b.failed(error="exit 3")
    t0 = trio.current_time()
    await b.wait()
    assert trio.current_time() - t0 == pytest.approx(1.0)
    await b.wait()  # waited out: the next call returns at once
    assert trio.current_time() - t0 == pytest.approx(1.0)
    # Half of the next delay already passed: only the rest is waited.
    b.failed()
    await trio.sleep(1.0)
    t1 = trio.current_time()
    await b.wait()
    assert trio.current_time() - t1 == pytest.approx(1.0)


async def test_past_the_wait_limit_a_request_fails_fast_saying_when_to_retry(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    for n in range(5):  # 1, 2, 4, 8, then 16 s: past the 10 s limit
        b.failed(uptime=0.2, error=f"the agent process exited with code {n}")
    t0 = trio.current_time()
    with pytest.raises(RuntimeRestarting) as err:
        await b.wait()
    assert trio.current_time() == t0  # no waiting at all
    exc = err.value
    assert isinstance(exc, c.RuntimeUnavailable) and exc.code == "unsupported"
    assert "the test agent is restarting after 5 failures in a row" in exc.message
    assert "(last: the agent process exited with code 4)" in exc.message
    assert "in 16 s" in exc.message and "UTC" in exc.message and "retry then" in exc.message
    assert exc.details["retry_after_s"] == pytest.approx(16)
    assert exc.details["failures"] == 5
    assert exc.details["retry_at"].endswith("Z")
    # The wire keeps code, message and details for the client.
    body = wire.ErrorBody(code=exc.code, message=exc.message, details=exc.details)
    back = wire.error_from_body(body)
    assert back.code == "unsupported" and back.details["failures"] == 5
    # Once 6 s passed, 10 s are left: now the request waits them out.
    await trio.sleep(6.0)
    await b.wait()
    assert trio.current_time() - t0 == pytest.approx(16)


async def test_a_conversation_slot_is_named_in_the_error(autojump_clock: trio.abc.Clock) -> None:
    b = backoff(wait_limit_s=0)
    b.failed("sess-1", error="boom")
    with pytest.raises(RuntimeRestarting, match=r"the test agent of conversation sess-1 is restarting after 1 failure in a row \(last: boom\)"):
        await b.wait("sess-1")


async def test_a_limit_of_zero_never_waits(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    b.failed()
    with pytest.raises(RuntimeRestarting):
        await b.wait(limit=0)
    await trio.sleep(1.0)
    await b.wait(limit=0)  # over: it may start


async def test_a_failure_during_the_wait_is_seen_before_starting(autojump_clock: trio.abc.Clock) -> None:
    """A waiter re-checks after its sleep: a failure meanwhile (another start of the slot) pushes it on."""
    b = backoff()
    b.failed()  # 1 s
    waited: list[float] = []

    async def waiter() -> None:
        t0 = trio.current_time()
        await b.wait()
        waited.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.5)
        b.failed()  # 2 s from now
    assert waited == [pytest.approx(2.5)]


async def test_waiting_is_cancellable(autojump_clock: trio.abc.Clock) -> None:
    b = backoff()
    for _ in range(3):
        b.failed()  # 4 s
    with trio.move_on_after(1.0) as scope:
        await b.wait()
    assert scope.cancelled_caught
    assert b.remaining() == pytest.approx(3.0)  # the backoff itself is untouched


async def test_explain_gives_the_latest_failure_its_reason(autojump_clock: trio.abc.Clock) -> None:
    b = backoff(wait_limit_s=0)
    b.failed(error="the Copilot CLI exited")
    b.explain("", "the Copilot CLI exited unexpectedly (killed by SIGKILL)")
    with pytest.raises(RuntimeRestarting, match="killed by SIGKILL"):
        await b.wait()


async def test_the_reason_is_kept_on_one_line(autojump_clock: trio.abc.Clock) -> None:
    b = backoff(wait_limit_s=0)
    b.failed(error="Command failed with exit code 4\nError output: " + "x" * 1000)
    with pytest.raises(RuntimeRestarting) as err:
        await b.wait()
    assert "\n" not in err.value.message
    assert "Command failed with exit code 4 Error output: xxx" in err.value.message
    assert len(err.value.details["last_error"]) == 300
