"""agentd._keyed_lock.KeyedLock: mutual exclusion per key, independence across keys, and no entry left
behind once nobody holds or waits for a key (after use, after an error, after a cancelled wait)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from agentd._keyed_lock import KeyedLock


async def test_tasks_on_one_key_take_turns_and_the_entry_goes_with_the_last() -> None:
    locks: KeyedLock[str] = KeyedLock()
    inside: list[int] = []
    most = 0
    order: list[int] = []

    async def user(i: int) -> None:
        nonlocal most
        async with locks("c1"):
            inside.append(i)
            most = max(most, len(inside))
            order.append(i)
            await trio.sleep(0.01)
            inside.remove(i)

    async with trio.open_nursery() as n:
        for i in range(5):
            n.start_soon(user, i)
            await trio.testing.wait_all_tasks_blocked()  # each waits in turn: first come, first served
        assert "c1" in locks and locks.locked("c1")
    assert most == 1
    assert order == [0, 1, 2, 3, 4]
    assert "c1" not in locks and len(locks) == 0


async def test_keys_do_not_wait_for_each_other() -> None:
    locks: KeyedLock[str] = KeyedLock()
    held = trio.Event()
    release = trio.Event()

    async def hold_a() -> None:
        async with locks("a"):
            held.set()
            await release.wait()

    async with trio.open_nursery() as n:
        n.start_soon(hold_a)
        await held.wait()
        with trio.fail_after(1):
            async with locks("b"):  # "a" is held the whole time
                assert locks.locked("a") and locks.locked("b")
        assert "b" not in locks and "a" in locks
        release.set()
    assert len(locks) == 0


async def test_an_error_in_the_block_releases_the_key_and_drops_its_entry() -> None:
    locks: KeyedLock[str] = KeyedLock()
    with pytest.raises(LookupError):
        async with locks("c1"):
            raise LookupError
    assert "c1" not in locks
    with trio.fail_after(1):
        async with locks("c1"):  # not left locked
            pass


async def test_a_waiter_cancelled_before_it_got_the_lock_leaves_no_entry_and_no_hold() -> None:
    locks: KeyedLock[str] = KeyedLock()
    release = trio.Event()
    got = []

    async def holder(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with locks("c1"):
            task_status.started()
            await release.wait()

    async def waiter(scope: trio.CancelScope) -> None:
        with scope:
            async with locks("c1"):
                got.append("never")

    async with trio.open_nursery() as n:
        await n.start(holder)
        scope = trio.CancelScope()
        n.start_soon(waiter, scope)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()  # while it waits
        await trio.testing.wait_all_tasks_blocked()
        assert "c1" in locks  # the holder still has it
        release.set()
    assert got == []
    assert "c1" not in locks and len(locks) == 0


async def test_a_holder_cancelled_inside_the_block_releases_the_key() -> None:
    locks: KeyedLock[str] = KeyedLock()
    with trio.move_on_after(0.01):
        async with locks("c1"):
            await trio.sleep_forever()
    assert "c1" not in locks
    with trio.fail_after(1):
        async with locks("c1"):
            assert locks.locked("c1")
