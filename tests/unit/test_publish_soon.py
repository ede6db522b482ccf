"""agentd.publish_soon: what is armed is published once the arming task yields, never before."""

from __future__ import annotations

import trio
import trio.testing

from agentd.publish_soon import PublishSoon


async def test_armed_items_are_published_at_the_next_pass_in_order(nursery: trio.Nursery) -> None:
    published: list[str] = []
    soon: PublishSoon[str] = PublishSoon(published.append)
    nursery.start_soon(soon.run)
    await trio.testing.wait_all_tasks_blocked()
    soon.arm("a")
    soon.arm("b")
    assert published == []  # this task has not yielded
    await trio.lowlevel.checkpoint()
    await trio.lowlevel.checkpoint()
    assert published == ["a", "b"]
    soon.arm("c")
    await trio.testing.wait_all_tasks_blocked()
    assert published == ["a", "b", "c"]


async def test_without_run_an_item_is_published_at_once_and_a_cancel_publishes_what_is_armed() -> None:
    published: list[str] = []
    soon: PublishSoon[str] = PublishSoon(published.append)
    soon.arm("now")
    assert published == ["now"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(soon.run)
        await trio.testing.wait_all_tasks_blocked()
        soon.arm("late")
        nursery.cancel_scope.cancel()
    assert published == ["now", "late"]
    soon.arm("after")  # run() returned: at once again
    assert published == ["now", "late", "after"]
