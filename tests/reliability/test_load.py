"""Slow clients and many clients: bounded memory, ``lagged`` instead of waiting, no deadlock, no lost event."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import trio

from agentd import wire

from .conftest import ECHO, fast_daemon, new
from .figures import FAULTS
from .test_faults import rss_mb


class AsyncClient:
    """A minimal trio client of the control protocol (many of them run in one test)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""
        self.next_id = 1
        self.replies: dict[int, Any] = {}
        self.events: dict[int, list[wire.Record]] = {}
        self.lagged: list[wire.LaggedFrame] = []

    @classmethod
    async def connect(cls, path: Path) -> "AsyncClient":
        self = cls(await trio.open_unix_socket(str(path)))
        assert isinstance(await self._read(), wire.HelloFrame)
        await self.stream.send_all(wire.encode(wire.Hello(id=0, protocol=wire.PROTOCOL_VERSION)))
        assert isinstance(await self._read(), wire.ResultFrame)
        return self

    async def _read(self) -> Any:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return wire.decode_server_frame(line)

    async def pump(self) -> None:
        """File every frame: replies by id, event records by subscription."""
        while True:
            frame = await self._read()
            if isinstance(frame, (wire.ResultFrame, wire.ErrorFrame)):
                self.replies[frame.id] = frame
            elif isinstance(frame, wire.EventFrame):
                self.events.setdefault(frame.sub, []).append(wire.decode_record(frame.record))
            elif isinstance(frame, wire.LaggedFrame):
                self.lagged.append(frame)

    async def send(self, op: type, **fields: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        await self.stream.send_all(wire.encode(op(id=rid, **fields)))
        return rid

    async def reply(self, rid: int) -> Any:
        while rid not in self.replies:
            await trio.sleep(0.005)
        frame = self.replies.pop(rid)
        if isinstance(frame, wire.ErrorFrame):
            raise wire.error_from_body(frame.error)
        return msgspec.json.decode(frame.result)


def _ended_runs(records: list[wire.Record]) -> set[str]:
    return {r.run for r in records if r.type == "turn" and msgspec.json.decode(r.data)["state"] != "working"}


def test_two_hundred_clients_subscribing_and_sending_lose_nothing_and_never_deadlock(tmp_path: Path) -> None:
    clients_n, conversations_n, prompts = 200, 100, 3
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        with d.client() as setup:
            cids = [new(setup, work, ECHO) for _ in range(conversations_n)]
        seen: dict[int, list[wire.Record]] = {}
        runs: dict[str, set[str]] = {cid: set() for cid in cids}

        async def one(i: int) -> None:
            cid = cids[i % conversations_n]
            client = await AsyncClient.connect(d.socket)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.pump)
                sub = await client.send(wire.Subscribe, conversation=cid, after=0, snapshot=False)
                await client.reply(sub)
                for n in range(prompts):
                    rid = await client.send(wire.Send, conversation=cid, text=f"client {i} prompt {n}", if_busy="queue")
                    runs[cid].add((await client.reply(rid))["run"])
                # Until every turn sent to this conversation (by this client and its twin) has ended.
                while not runs[cid] <= _ended_runs(client.events.get(sub, [])) or len(runs[cid]) < 2 * prompts:
                    assert not client.lagged, client.lagged
                    await trio.sleep(0.02)
                seen[i] = client.events[sub]
                nursery.cancel_scope.cancel()
            await client.stream.aclose()

        async def main() -> None:
            with trio.fail_after(180):  # no deadlock
                async with trio.open_nursery() as nursery:
                    for i in range(clients_n):
                        nursery.start_soon(one, i)

        t0 = time.monotonic()
        trio.run(main)
        took = time.monotonic() - t0
        FAULTS["concurrent clients"] += clients_n
        for i, records in seen.items():
            cid = cids[i % conversations_n]
            durable = [r.seq for r in records if r.seq]
            journal = d.journal(cid)
            # Every durable record, in order, once: the journal as far as this client followed it.
            assert durable == [r["seq"] for r in journal][: len(durable)], f"client {i}: gap or duplicate"
            assert len(_ended_runs(records)) >= 2 * prompts
        for cid in cids:
            prompts_seen = [r["data"]["text"] for r in d.journal(cid) if r["type"] == "prompt"]
            assert len(prompts_seen) == 2 * prompts
        assert took < 180
    finally:
        d.stop()


def test_a_stopped_subscriber_is_cut_off_with_lagged_memory_stays_bounded_and_others_keep_their_latency(
    tmp_path: Path,
) -> None:
    # ~12 MB of deltas in 500-character chunks, over several items.
    flood = tmp_path / "flood.toml"
    steps = "".join(f'[[turn.step]]\nkind = "text"\nchunk = 500\ndelay_ms = 0\ntext = "{chr(97 + n % 26) * 2_000_000}"\n'
                    for n in range(6))
    flood.write_text(f'model = "flood"\n[[turn]]\n{steps}')
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        with d.client() as a, d.client() as stopped, d.client() as probe:
            cid = new(a, work, flood)
            other = new(probe, work, ECHO)
            probe.subscribe(other)
            # The stopped client subscribes to the flood, and to everything, then never reads.
            stopped.subscribe(cid)
            stopped.subscribe(None)
            base = rss_mb(d.proc.pid)
            peak = base
            run = a.request(wire.Send, conversation=cid, text="flood")["run"]
            FAULTS["stopped subscriber"] += 1
            latencies: list[float] = []
            status_rtt: list[float] = []
            n = 0
            deadline = time.monotonic() + 120
            ended = False
            while not ended:
                assert time.monotonic() < deadline, "the flood never ended"
                n += 1
                t0 = time.monotonic()
                probe.request(wire.Status)
                status_rtt.append(time.monotonic() - t0)
                t0 = time.monotonic()
                prun = probe.request(wire.Send, conversation=other, text=f"probe {n}")["run"]
                probe.follow(prun, timeout=30)
                latencies.append(time.monotonic() - t0)
                peak = max(peak, rss_mb(d.proc.pid))
                ended = not probe.request(wire.Show, conversation=cid)["record"].get("active_run")
            ends = [r for r in d.journal(cid) if r["type"] == "turn" and r.get("run") == run]
            assert ends[-1]["data"]["state"] == "completed"
            # Now the stopped client reads: what fitted, then `lagged` on both subscriptions.
            lagged = []
            stopped.sock.settimeout(10)
            for frame in stopped.frames(timeout=10):
                if isinstance(frame, wire.LaggedFrame):
                    lagged.append(frame)
                    if len(lagged) == 2:
                        break
            assert {f.conversation for f in lagged} == {cid, ""}
        growth = peak - base
        # Bounded: the flood's text (12 MB, kept for snapshots until the turn ends) and one outbox,
        # not the 12 MB x subscribers a waiting daemon would hold.
        assert growth < 150, f"RSS grew by {growth:.0f} MB"
        p50, p_max = statistics.median(latencies), max(latencies)
        # The worst of many samples on a machine the suite loads: roomy, yet far below a daemon the flood holds.
        assert p_max < 4.0, f"the other conversation's turns took up to {p_max:.2f}s (median {p50:.2f}s)"
        assert max(status_rtt) < 2.5, f"status took up to {max(status_rtt):.2f}s"
        print(f"flood: rss +{growth:.0f} MB, probe turn median {p50*1000:.0f} ms max {p_max*1000:.0f} ms, "
              f"status max {max(status_rtt)*1000:.0f} ms over {n} probes")
    finally:
        d.stop()


def test_twenty_agentctl_processes_at_once(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "run", "--provider", "script",
                 "--model", str(ECHO), "--cwd", str(work), "--json", f"agentctl {i}"],
                env={**d.env, "AGENTD_NO_AUTOSTART": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(20)
        ]
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            last = json.loads(out.strip().splitlines()[-1])
            assert last["type"] == "result" and last["state"] == "completed", last
        FAULTS["concurrent agentctl processes"] += len(procs)
    finally:
        d.stop()
