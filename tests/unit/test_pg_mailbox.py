"""Commands carried to the lease holder through PostgreSQL (agentd.store.postgres._mailbox), two hosts
on one real database: answered by the holder, no holder, a silent holder (never runs), a holder that
took it and went quiet (uncertain, never retried), a failing handler, many calls at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from agentd import contract as c
from agentd.store.postgres import Listener, Pool, migrate
from agentd.store.postgres._leases import PgLeaseStore
from agentd.store.postgres._mailbox import (COMMANDS_CHANNEL, REPLIES_CHANNEL, Command, HolderSilent, Mailbox, NoHolder,
                                              SiteDown)
from pgcluster import PgDatabase


@asynccontextmanager
async def _host(dsn: str, owner: str, nursery: trio.Nursery) -> AsyncIterator[tuple[Mailbox, PgLeaseStore]]:
    async with Pool(dsn, size=3) as pool:
        listener = Listener(dsn, [COMMANDS_CHANNEL, REPLIES_CHANNEL])
        await nursery.start(listener.run)
        yield Mailbox(pool, listener, owner=owner), PgLeaseStore(pool, owner=owner)


@pytest.fixture
async def dsn(pg_db: PgDatabase) -> str:
    async with Pool(pg_db.dsn, size=1) as pool:
        await migrate(pool)
    return pg_db.dsn


async def test_the_holder_answers_a_command_sent_from_another_host(dsn: str) -> None:
    seen: list[Command] = []

    async def handler(cmd: Command) -> bytes:
        seen.append(cmd)
        return b"done:" + cmd.request

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, a_leases), _host(dsn, "hostB", n) as (b, _):
            await a_leases.acquire("c1")
            await n.start(a.serve, handler)
            with trio.fail_after(10):
                assert await b.call("c1", "send", b'{"text":"hi"}') == b'done:{"text":"hi"}'
            assert [(x.conversation_id, x.op, x.sender) for x in seen] == [("c1", "send", "hostB")]
            n.cancel_scope.cancel()


async def test_no_live_holder_is_said_at_once(dsn: str, pg_db: PgDatabase) -> None:
    async with trio.open_nursery() as n:
        async with _host(dsn, "hostB", n) as (b, _):
            with trio.fail_after(2), pytest.raises(NoHolder, match="no host holds conversation c9"):
                await b.call("c9", "send", b"{}")
            pg_db.execute("INSERT INTO leases (key, owner, pid, expires_at) VALUES ('c8', 'dead', 1, now())")
            with trio.fail_after(2), pytest.raises(NoHolder):
                await b.call("c8", "send", b"{}")  # its lease expired: nobody holds it
            n.cancel_scope.cancel()


async def test_a_command_for_a_site_goes_to_its_newest_live_host_and_a_site_with_none_is_said_at_once(
        dsn: str, pg_db: PgDatabase) -> None:
    seen: list[Command] = []

    async def handler(cmd: Command) -> bytes:
        seen.append(cmd)
        return b"ok"

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, _), _host(dsn, "hostB", n) as (b, _):
            async with Pool(dsn, size=1) as pool:
                await PgLeaseStore(pool, owner="hostA", site="h:/a").beat()
            # An older instance of the same site whose row has not expired yet (killed, then restarted), and
            # the expired row of another site's host.
            pg_db.execute("INSERT INTO hosts (owner, hostname, pid, site, providers, started_at, expires_at) VALUES "
                          "('old', 'h', 1, 'h:/a', '{}', now() - interval '1 hour', now() + interval '1 hour'), "
                          "('gone', 'h', 2, 'h:/g', '{}', now(), now())")
            await n.start(a.serve, handler)
            with trio.fail_after(10):
                assert await b.call("c1", "show", b"{}", site="h:/a") == b"ok"  # nobody holds c1's lease
            assert [(x.conversation_id, x.sender) for x in seen] == [("c1", "hostB")]
            for site in ("h:/g", "h:/nobody"):
                with trio.fail_after(2), pytest.raises(SiteDown, match=f"no agentd of site {site} is running"):
                    await b.call("c1", "show", b"{}", site=site)
            assert pg_db.execute("SELECT count(*) FROM commands") == [(1,)]  # none posted for those
            n.cancel_scope.cancel()


async def test_a_silent_holder_never_runs_the_command_after_the_sender_gave_up(dsn: str, pg_db: PgDatabase) -> None:
    ran: list[Command] = []

    async def handler(cmd: Command) -> bytes:
        ran.append(cmd)
        return b"late"

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, a_leases), _host(dsn, "hostB", n) as (b, _):
            await a_leases.acquire("c1")
            with pytest.raises(HolderSilent, match="did not take the command within 0.3 s; it did not run"):
                await b.call("c1", "send", b"{}", timeout_s=0.3)
            assert pg_db.execute("SELECT state FROM commands") == [("expired",)]
            await n.start(a.serve, handler)
            await trio.sleep(0.3)
            assert ran == []
            n.cancel_scope.cancel()


async def test_a_holder_that_took_it_and_went_quiet_is_uncertain(dsn: str) -> None:
    async def handler(cmd: Command) -> bytes:
        await trio.sleep(1.0)
        return b"too late"

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, a_leases), _host(dsn, "hostB", n) as (b, _):
            await a_leases.acquire("c1")
            await n.start(a.serve, handler)
            with pytest.raises(c.SubmissionUncertain, match="may or may not have run"):
                await b.call("c1", "send", b"{}", timeout_s=0.3)
            n.cancel_scope.cancel()


async def test_a_failing_handler_is_an_internal_error_for_the_sender(dsn: str) -> None:
    async def handler(cmd: Command) -> bytes:
        raise RuntimeError("runtime exploded")

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, a_leases), _host(dsn, "hostB", n) as (b, _):
            await a_leases.acquire("c1")
            await n.start(a.serve, handler)
            with trio.fail_after(10), pytest.raises(c.InternalError, match="RuntimeError: runtime exploded"):
                await b.call("c1", "cancel", b"{}")
            n.cancel_scope.cancel()


async def test_many_calls_at_once_each_get_their_own_answer(dsn: str) -> None:
    async def handler(cmd: Command) -> bytes:
        await trio.sleep(0.01)
        return cmd.request[::-1]

    async with trio.open_nursery() as n:
        async with _host(dsn, "hostA", n) as (a, a_leases), _host(dsn, "hostB", n) as (b, _):
            for k in ("c1", "c2"):
                await a_leases.acquire(k)
            await n.start(a.serve, handler)
            answers: dict[bytes, bytes] = {}

            async def one(i: int) -> None:
                req = f"req-{i:03d}".encode()
                answers[req] = await b.call(f"c{1 + i % 2}", "steer", req)

            with trio.fail_after(20):
                async with trio.open_nursery() as calls:
                    for i in range(20):
                        calls.start_soon(one, i)
            assert len(answers) == 20 and all(v == k[::-1] for k, v in answers.items())
            n.cancel_scope.cancel()
