"""agentd._quick_lock.QuickLock: a free lock is taken without a scheduler pass; a held one is
waited for in order, as a trio.Lock, and a cancelled waiter leaves it usable."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from agentd._quick_lock import QuickLock


async def test_a_free_lock_is_taken_without_letting_another_task_run() -> None:
    lock = QuickLock()
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        async with lock:  # a trio.Lock would yield here, and `other` would run first
            assert lock.locked() and ran == []
        assert not lock.locked()
    assert ran == ["other"]


async def test_a_held_lock_is_waited_for_first_come_first_served() -> None:
    lock = QuickLock()
    order: list[int] = []

    async def user(n: int) -> None:
        async with lock:
            order.append(n)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await lock.__aenter__()
        for n in range(4):
            nursery.start_soon(user, n)
            await trio.testing.wait_all_tasks_blocked()
        await lock.__aexit__(None, None, None)
        # the released lock passes to the first waiter: a newcomer cannot take it free
        async with lock:
            order.append(99)
    assert order == [0, 1, 2, 3, 99]


async def test_a_waiter_cancelled_while_waiting_leaves_the_lock_usable() -> None:
    lock = QuickLock()
    cancelled: list[bool] = []

    async def waiter() -> None:
        with trio.move_on_after(0.01) as scope:
            async with lock:
                pytest.fail("a held lock was taken twice")
        cancelled.append(scope.cancelled_caught)

    async with lock:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
    assert cancelled == [True] and not lock.locked()
    async with lock:
        assert lock.locked()
