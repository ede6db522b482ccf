"""Replies that may be large (agentd.server.LARGE_REPLIES), on the real service and server code.

A client that asks for many exports and reads none makes agentd build one at a time, once the
client took the reply before; a reply over what a client reads in one frame is a ``limit`` error
saying so, not a frame the client must refuse. (Through the real daemon and its memory:
tests/reliability/test_bounded_clients.py.)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentd import server as server_mod
from agentd import wire
from agentd.server import Server, _Connection
from inprocess import in_process_service


def _frames(conn: _Connection) -> list[Any]:
    return [wire.decode_server_frame(line) for chunk in conn._frames for line in chunk.splitlines()]


async def _conversation(service: Any, tmp_path: Path, text: str) -> str:
    script = tmp_path / "echo.toml"
    script.write_text('model = "echo"\nchunk = 65536\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "text"\n'
                      'text = "{prompt}"\n')
    work = tmp_path / "work"
    work.mkdir()
    record = await service.create(provider="script", workdir=str(work), model=str(script))
    live = await service.live(record.id)
    await service.send(record.id, text)
    with trio.fail_after(10):
        while live.record.active_run:
            await trio.sleep(0.005)
    return str(record.id)


async def test_a_reply_over_the_client_frame_limit_is_a_limit_error_naming_the_sizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with in_process_service(tmp_path) as (service, hub):
        cid = await _conversation(service, tmp_path, "x" * 50_000)
        server = Server(service, hub, state_dir=tmp_path / "state", socket_path=tmp_path / "s.sock", check_uid=False)
        conn = _Connection(server, trio.testing.memory_stream_pair()[0], "test", 4096)
        await server._answer_request(conn, wire.Export(id=1, conversation=cid, format="md"))
        whole = _frames(conn)[-1]
        assert isinstance(whole, wire.ResultFrame)
        size = len(msgspec.json.decode(whole.result)["text"])
        assert size > 100_000  # the prompt and its echo

        monkeypatch.setattr(wire, "CLIENT_MAX_FRAME_BYTES", 60_000)
        await server._answer_request(conn, wire.Export(id=2, conversation=cid, format="md"))
        refused = _frames(conn)[-1]
        assert isinstance(refused, wire.ErrorFrame) and refused.id == 2
        assert refused.error.code == "limit"
        assert "the reply to export is" in refused.error.message and "60,000" in refused.error.message
        assert "agentctl history" in refused.error.message
        assert refused.error.details["limit"] == 60_000 and refused.error.details["bytes"] > size
        # A small reply on the same connection goes on as before.
        await server._answer_request(conn, wire.Status(id=3))
        assert isinstance(_frames(conn)[-1], wire.ResultFrame)


async def _queued(conn: _Connection) -> None:
    """Return once a reply is queued and every task waits (the render runs in a worker thread)."""
    with trio.fail_after(10):
        while not conn._count:
            await trio.sleep(0.005)
    await trio.testing.wait_all_tasks_blocked(cushion=0.05)


async def test_exports_a_client_does_not_read_are_built_one_at_a_time_after_it_reads(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, hub):
        cid = await _conversation(service, tmp_path, "y" * 20_000)
        server = Server(service, hub, state_dir=tmp_path / "state", socket_path=tmp_path / "s.sock", check_uid=False,
                        outbox_bytes=1024)
        # No writer task: what is queued stays queued, as for a client that does not read.
        conn = _Connection(server, trio.testing.memory_stream_pair()[0], "test", 4096, buffer_bytes=1024)
        started = 0
        real_export = service.export

        async def export(*args: Any, **kwargs: Any) -> Any:
            nonlocal started
            started += 1
            return await real_export(*args, **kwargs)

        service.export = export
        async with trio.open_nursery() as nursery:
            for i in range(1, 6):
                nursery.start_soon(functools.partial(server._answer_request, conn, wire.Export(
                    id=i, conversation=cid, format="md")))
            await _queued(conn)
            # The first reply is queued, over the outbox's bytes: nothing more is built.
            assert started == 1 and conn._count == 1
            for taken in range(2, 6):
                conn._frames, conn._count, conn._bytes = [], 0, 0  # the client reads what is queued
                assert conn._room is not None
                conn._room.set()
                conn._room = None
                await _queued(conn)
                assert started == taken and conn._count == 1
        assert server_mod.EXPORTS_AT_ONCE >= 1


async def test_an_item_over_the_item_bound_is_journaled_cut_whatever_the_provider(tmp_path: Path) -> None:
    # The script provider keeps its echo whole; the service cuts what it journals (and publishes).
    from agentd import runtime_output

    async with in_process_service(tmp_path) as (service, hub):
        bound = runtime_output.MAX_ITEM_TEXT_CHARS
        cid = await _conversation(service, tmp_path, "z" * (bound + 1000))
        live = await service.live(cid)
        lines = await service.published_lines(live)
        items = [msgspec.json.decode(wire.decode_record(line).data) for line in lines
                 if wire.decode_record(line).type == "item"]
        (echo,) = [i for i in items if i["kind"] == "assistant"]
        assert echo["text"] == "z" * bound + runtime_output.cut_note(1000)


async def test_an_item_of_control_characters_at_the_bound_is_a_record_a_client_reads(tmp_path: Path) -> None:
    # JSON writes each as six bytes (\u0001): at the old bound (16 Mi characters) the record was
    # 100 MB, over the 64 MiB a client reads, and no tail, history page or export could pass it.
    from agentd import runtime_output

    async with in_process_service(tmp_path) as (service, hub):
        cid = await _conversation(service, tmp_path, "\x01" * (runtime_output.MAX_ITEM_TEXT_CHARS + 1000))
        live = await service.live(cid)
        lines = await service.published_lines(live)
        (echo,) = [line for line in lines if wire.decode_record(line).type == "item"
                   and msgspec.json.decode(wire.decode_record(line).data)["kind"] == "assistant"]
        assert len(echo) < wire.CLIENT_MAX_FRAME_BYTES - (1 << 20)


async def test_a_reply_carried_from_another_host_over_the_client_frame_limit_is_a_limit_error_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several hosts on one database (agentd.hosts): the host that runs a conversation answers its
    # show_item, and this host passes the frame on; one over what a client reads is refused the same way.
    class Peers:
        carried = {wire.ShowItem}

        async def carry(self, request: Any) -> bytes:
            return wire.encode_result(request.id, {"item": "z" * 80_000})

    async with in_process_service(tmp_path) as (service, hub):
        server = Server(service, hub, state_dir=tmp_path / "state", socket_path=tmp_path / "s.sock", check_uid=False)
        server.peers = Peers()  # type: ignore[assignment]
        conn = _Connection(server, trio.testing.memory_stream_pair()[0], "test", 4096)
        monkeypatch.setattr(wire, "CLIENT_MAX_FRAME_BYTES", 60_000)
        await server._answer_request(conn, wire.ShowItem(id=7, conversation="c1", item="i1"))
        refused = _frames(conn)[-1]
        assert isinstance(refused, wire.ErrorFrame) and refused.id == 7 and refused.error.code == "limit"
        assert refused.error.details["bytes"] > 80_000 and "show_item" in refused.error.message


async def test_a_reply_no_frame_can_hold_fails_its_request_and_the_connection_goes_on(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, hub):
        server = Server(service, hub, state_dir=tmp_path / "state", socket_path=tmp_path / "s.sock", check_uid=False)
        conn = _Connection(server, trio.testing.memory_stream_pair()[0], "test", 4096)

        async def unencodable(conn: Any, request: Any) -> Any:
            return {"title": "nice \ud83d title"}  # what a runtime's JSON once put in a record

        server._handlers[wire.Status] = unencodable
        await server._answer_request(conn, wire.Status(id=1))
        server._handlers[wire.Status] = server._status
        await server._answer_request(conn, wire.Status(id=2))
        failed, answered = _frames(conn)[-2:]
        assert isinstance(failed, wire.ErrorFrame) and failed.id == 1 and failed.error.code == "internal"
        assert "could not be encoded" in failed.error.message
        assert isinstance(answered, wire.ResultFrame) and answered.id == 2
