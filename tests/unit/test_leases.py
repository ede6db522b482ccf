"""One daemon per state dir, and conversation leases: acquire, renew, release, take over."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import structlog
import trio

from agentd.contract import NotFound
from agentd.leases import (
    AlreadyRunning,
    DaemonLock,
    FileLeaseStore,
    Lease,
    LeaseHeld,
    LeaseOutcome,
    LeaseStore,
)

REPO = pathlib.Path(__file__).resolve().parents[2]


def python(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --------------------------------------------------------------------------- daemon lock


def test_second_daemon_lock_in_another_process_fails_with_the_holders_pid(tmp_path: pathlib.Path) -> None:
    lock = DaemonLock.acquire(tmp_path)
    try:
        proc = python(
            f"""
            import pathlib
            from agentd.leases import AlreadyRunning, DaemonLock
            try:
                DaemonLock.acquire(pathlib.Path({str(tmp_path)!r}))
            except AlreadyRunning as exc:
                print(exc.pid)
                print(exc.message)
            """
        )
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        pid, message = out.splitlines()
        assert int(pid) == os.getpid()
        assert message == f"another agentd (pid {os.getpid()}) holds {tmp_path / 'agentd.lock'}"
    finally:
        lock.release()
    # Released: the next daemon gets it.
    DaemonLock.acquire(tmp_path).release()


def test_daemon_lock_is_released_when_its_holder_is_sigkilled(tmp_path: pathlib.Path) -> None:
    proc = python(
        f"""
        import pathlib, sys, time
        from agentd.leases import DaemonLock
        DaemonLock.acquire(pathlib.Path({str(tmp_path)!r}))
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked", proc.stderr.read() if proc.stderr else ""
        with pytest.raises(AlreadyRunning) as info:
            DaemonLock.acquire(tmp_path)
        assert info.value.pid == proc.pid
        assert str(proc.pid) in info.value.message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout and proc.stdout.close()
        proc.stderr and proc.stderr.close()

    with DaemonLock.acquire(tmp_path) as lock:
        assert (tmp_path / "agentd.lock").read_text().strip() == str(os.getpid())
        assert lock.path == tmp_path / "agentd.lock"


def test_daemon_lock_is_exclusive_within_one_process_too(tmp_path: pathlib.Path) -> None:
    lock = DaemonLock.acquire(tmp_path / "state")
    with pytest.raises(AlreadyRunning) as info:
        DaemonLock.acquire(tmp_path / "state")
    assert info.value.pid == os.getpid()
    lock.release()
    lock.release()
    DaemonLock.acquire(tmp_path / "state").release()


# --------------------------------------------------------------------------- leases


def write_lease(root: pathlib.Path, key: str, owner: str, expires_at: float) -> None:
    (root / key).mkdir(parents=True, exist_ok=True)
    lease = Lease(key=key, owner=owner, pid=4242, acquired_at="2024-01-01T00:00:00.000Z", expires_at=expires_at)
    (root / key / "lease.json").write_bytes(msgspec.json.encode(lease))


def test_file_lease_store_implements_the_lease_store_interface(tmp_path: pathlib.Path) -> None:
    assert isinstance(FileLeaseStore(tmp_path, owner="me"), LeaseStore)


def test_acquire_renew_release(tmp_path: pathlib.Path) -> None:
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=30)
    before = time.time()
    assert store.acquire("c1") == LeaseOutcome("acquired")
    lease = store.get("c1")
    assert lease is not None
    assert (lease.key, lease.owner, lease.pid) == ("c1", "me", os.getpid())
    assert before + 30 <= lease.expires_at <= time.time() + 30
    assert lease.acquired_at.endswith("Z")
    assert store.held() == ["c1"]

    time.sleep(0.01)
    store.renew("c1")
    renewed = store.get("c1")
    assert renewed is not None
    assert renewed.expires_at > lease.expires_at and renewed.acquired_at == lease.acquired_at

    assert store.acquire("c1") == LeaseOutcome("renewed")

    store.release("c1")
    assert store.get("c1") is None and store.held() == []
    store.release("c1")  # idempotent
    with pytest.raises(NotFound):
        store.renew("c1")


@pytest.mark.parametrize("exclusive", [True, False])
def test_expired_lease_of_another_owner_is_taken_over(tmp_path: pathlib.Path, exclusive: bool) -> None:
    write_lease(tmp_path, "c1", "dead-daemon", expires_at=time.time() - 5)
    store = FileLeaseStore(tmp_path, owner="me", exclusive=exclusive)
    assert store.acquire("c1") == LeaseOutcome("taken_over", previous_owner="dead-daemon", previous_expired=True)
    lease = store.get("c1")
    assert lease is not None and lease.owner == "me" and lease.expires_at > time.time()
    assert store.held() == ["c1"]


def test_unexpired_lease_of_another_owner_is_taken_over_when_exclusive(tmp_path: pathlib.Path) -> None:
    write_lease(tmp_path, "c1", "other", expires_at=time.time() + 60)
    store = FileLeaseStore(tmp_path, owner="me", exclusive=True)
    assert store.acquire("c1") == LeaseOutcome("taken_over", previous_owner="other", previous_expired=False)
    lease = store.get("c1")
    assert lease is not None and lease.owner == "me"


def test_unexpired_lease_of_another_owner_is_held_when_not_exclusive(tmp_path: pathlib.Path) -> None:
    write_lease(tmp_path, "c1", "other", expires_at=time.time() + 60)
    store = FileLeaseStore(tmp_path, owner="me", exclusive=False)
    with pytest.raises(LeaseHeld) as info:
        store.acquire("c1")
    assert info.value.code == "busy"
    assert info.value.lease.owner == "other" and "other" in info.value.message
    lease = store.get("c1")
    assert lease is not None and lease.owner == "other"  # untouched
    assert store.held() == []


def test_renew_and_release_never_touch_another_owners_lease(tmp_path: pathlib.Path) -> None:
    store = FileLeaseStore(tmp_path, owner="me")
    store.acquire("c1")
    write_lease(tmp_path, "c1", "thief", expires_at=time.time() + 60)
    with pytest.raises(LeaseHeld):
        store.renew("c1")
    assert store.held() == []
    store.release("c1")
    lease = store.get("c1")
    assert lease is not None and lease.owner == "thief"


async def test_run_renews_held_leases(tmp_path: pathlib.Path) -> None:
    # ttl_s 1 s: a loaded machine may stall this process a few hundred ms between renewals
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=1.0, exclusive=False)
    store.acquire("c1")
    store.acquire("c2")
    first = {k: store.get(k).expires_at for k in ("c1", "c2")}  # type: ignore[union-attr]
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.sleep(1.2)  # past the first expiry; renewals come every ttl_s / 3
        for key in ("c1", "c2"):
            lease = store.get(key)
            assert lease is not None and lease.expires_at > first[key]
            assert lease.expires_at > time.time()
        nursery.cancel_scope.cancel()
    assert store.held() == ["c1", "c2"]


async def test_run_renews_every_lease_with_one_heartbeat_write(tmp_path: pathlib.Path) -> None:
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=1.0, exclusive=False)
    keys = [f"c{i}" for i in range(50)]
    for key in keys:
        store.acquire(key)
    stamps = {key: (tmp_path / key / "lease.json").stat().st_mtime_ns for key in keys}
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.sleep(1.5)  # past the leases' own expiry: only the heartbeat keeps them
        for key in keys:
            lease = store.get(key)
            assert lease is not None and lease.expires_at > time.time(), key
        nursery.cancel_scope.cancel()
    assert {key: (tmp_path / key / "lease.json").stat().st_mtime_ns for key in keys} == stamps
    assert sorted(p.name for p in (tmp_path / ".lease-owners").iterdir()) == ["me.json"]
    # another owner can take none of them while the heartbeat is fresh
    other = FileLeaseStore(tmp_path, owner="other", ttl_s=1.0, exclusive=False)
    store._beat()
    with pytest.raises(LeaseHeld):
        other.acquire("c7")


async def test_a_dead_owners_leases_expire_with_its_heartbeat(tmp_path: pathlib.Path) -> None:
    dead = FileLeaseStore(tmp_path, owner="dead", ttl_s=0.2)
    dead.acquire("c1")
    other = FileLeaseStore(tmp_path, owner="other", ttl_s=30, exclusive=False)
    with pytest.raises(LeaseHeld):
        other.acquire("c1")
    time.sleep(0.25)
    outcome = other.acquire("c1")
    assert outcome.action == "taken_over" and outcome.previous_owner == "dead" and outcome.previous_expired


async def test_run_drops_a_lease_taken_by_another_owner(tmp_path: pathlib.Path) -> None:
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=0.15, exclusive=False)
    store.acquire("c1")
    store.acquire("c2")
    time.sleep(0.2)  # this daemon stalled past its heartbeat: another owner took c2 meanwhile
    write_lease(tmp_path, "c2", "other", expires_at=time.time() + 60)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            with trio.fail_after(5):
                while store.held() != ["c1"]:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert store.held() == ["c1"]
    assert [(e["event"], e["key"]) for e in logs] == [("lease.lost", "c2")]
    lease = store.get("c2")
    assert lease is not None and lease.owner == "other"


async def test_run_holding_nothing_never_wakes_until_the_first_lease(tmp_path: pathlib.Path) -> None:
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=0.6, exclusive=False)  # rounds every 0.2 s
    steps: list[float] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("FileLeaseStore.run"):
                steps.append(trio.current_time())

    heartbeat = tmp_path / ".lease-owners" / "me.json"
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        trio.lowlevel.add_instrument(Steps())
        await trio.sleep(1.0)  # five renewal periods, holding nothing
        assert steps == [] and not heartbeat.exists()
        store.acquire("c1")  # writes the heartbeat itself, and wakes run
        await trio.sleep(1.0)  # past the lease's own expiry: run's rounds keep it
        lease = store.get("c1")
        assert lease is not None and lease.expires_at > time.time()
        assert len(steps) >= 3
        nursery.cancel_scope.cancel()


async def test_a_round_with_a_fresh_heartbeat_reads_no_lease(tmp_path: pathlib.Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=0.9, exclusive=False)  # rounds every 0.3 s, lapsed 0.6 s late
    for key in ("c1", "c2"):
        store.acquire(key)
    looked_at: list[list[str]] = []
    renew_many = store._renew_many
    monkeypatch.setattr(store, "_renew_many", lambda keys: looked_at.append(keys) or renew_many(keys))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.sleep(1.0)
        assert looked_at == []  # each round was one heartbeat write
        time.sleep(1.0)  # this daemon stalls past its heartbeat: the next round reads each lease
        with trio.fail_after(5):
            while not looked_at:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert looked_at == [["c1", "c2"]]


async def test_an_exclusive_store_holding_leases_never_wakes_and_writes_nothing(tmp_path: pathlib.Path) -> None:
    # The daemon lock proves the owner alive (agentd.leases): no renewal round, no timer, no write.
    store = FileLeaseStore(tmp_path, owner="me", ttl_s=0.3)
    keys = [f"c{i}" for i in range(20)]
    for key in keys:
        store.acquire(key)
    stamps = {key: (tmp_path / key / "lease.json").stat().st_mtime_ns for key in keys}
    steps: list[float] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("FileLeaseStore.run"):
                steps.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        trio.lowlevel.add_instrument(Steps())
        await trio.sleep(1.0)  # past the leases' own expiry, ten heartbeat periods of a shared store
        assert steps == []
        assert trio.lowlevel.current_statistics().seconds_to_next_deadline == float("inf")
        for key in keys:
            lease = store.get(key)
            assert lease is not None and lease.owner == "me" and lease.expires_at > time.time() + 0.2, key
        nursery.cancel_scope.cancel()
    assert {key: (tmp_path / key / "lease.json").stat().st_mtime_ns for key in keys} == stamps
    assert not (tmp_path / ".lease-owners").exists()
    assert store.held() == sorted(keys)

