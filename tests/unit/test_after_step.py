"""agentd._after_step: a deferred call is made once the deferring task yields, never before."""

from __future__ import annotations

import trio
import trio.testing

from agentd._after_step import AfterStep


async def test_deferred_calls_are_made_at_the_next_pass_in_order(nursery: trio.Nursery) -> None:
    published: list[str] = []
    soon: AfterStep[str] = AfterStep(published.append)
    nursery.start_soon(soon.run)
    await trio.testing.wait_all_tasks_blocked()
    soon.defer("a")
    soon.defer("b")
    assert published == []  # this task has not yielded
    await trio.lowlevel.checkpoint()
    await trio.lowlevel.checkpoint()
    assert published == ["a", "b"]
    soon.defer("c")
    await trio.testing.wait_all_tasks_blocked()
    assert published == ["a", "b", "c"]


async def test_without_run_a_call_is_made_at_once_and_a_cancel_makes_those_deferred() -> None:
    published: list[str] = []
    soon: AfterStep[str] = AfterStep(published.append)
    soon.defer("now")
    assert published == ["now"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(soon.run)
        await trio.testing.wait_all_tasks_blocked()
        soon.defer("late")
        nursery.cancel_scope.cancel()
    assert published == ["now", "late"]
    soon.defer("after")  # run() returned: at once again
    assert published == ["now", "late", "after"]
