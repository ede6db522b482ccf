"""agentd/_tree_watch.py: a watch that says "unchanged" only when nothing under the tree changed,
and the checkpoint shadow that trusts it to skip git (agentd/checkpoints.py)."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
import trio

from agentd import _tree_watch as tw
from agentd import checkpoints as cp
from agentd.config import CheckpointsConfig

pytestmark = pytest.mark.skipif(not tw.SUPPORTED, reason="inotify is Linux only")


def _tree(root: Path) -> Path:
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "a.txt").write_text("a\n")
    (root / "src" / "deep" / "b.txt").write_text("b\n")
    (root / "top.txt").write_text("top\n")
    (root / ".git" / "info").mkdir(parents=True)
    (root / ".git" / "info" / "exclude").write_text("")
    (root / "state").mkdir()
    return root


def _watch(root: Path, **kw: object) -> tw.TreeWatch:
    watch = tw.TreeWatch(str(root), exclude=frozenset({str(root / "state")}), **kw)  # type: ignore[arg-type]
    assert watch.mark(), watch.unarmed
    assert not watch.changed()
    return watch


CHANGES = {
    "append to a file": lambda r: open(r / "src" / "a.txt", "a").write("more\n"),
    "a new file deep down": lambda r: (r / "src" / "deep" / "new.txt").write_text("n\n"),
    "delete a file": lambda r: (r / "top.txt").unlink(),
    "rename a file": lambda r: (r / "top.txt").rename(r / "src" / "moved.txt"),
    "chmod a file": lambda r: os.chmod(r / "src" / "a.txt", 0o755),
    "an empty directory": lambda r: (r / "src" / "empty").mkdir(),
    "the user's exclude": lambda r: (r / ".git" / "info" / "exclude").write_text("*.txt\n"),
    "a symlink": lambda r: os.symlink("top.txt", r / "link"),
    "the tree's root moved away": lambda r: r.rename(r.with_name("elsewhere")),
}


@pytest.mark.parametrize("change", CHANGES)
def test_every_kind_of_change_is_seen(tmp_path: Path, change: str) -> None:
    root = _tree(tmp_path / "work")
    watch = _watch(root)
    CHANGES[change](root)
    assert watch.changed()
    assert watch.changed(), "it stays changed until the next mark"
    watch.close()


def test_what_the_snapshot_does_not_hold_is_no_change(tmp_path: Path) -> None:
    root = _tree(tmp_path / "work")
    watch = _watch(root)
    (root / "state" / "journal.jsonl").write_text("agentd's own\n")  # excluded: agentd's state dir
    (root / ".git" / "index").write_text("git's own\n")  # the user's repository, but for info/
    (root / "src" / "a.txt").read_text()  # reading is no change
    assert not watch.changed()
    watch.close()


def test_a_file_made_in_a_new_directory_after_the_next_mark_is_seen(tmp_path: Path) -> None:
    root = _tree(tmp_path / "work")
    watch = _watch(root)
    (root / "fresh" / "inner").mkdir(parents=True)
    assert watch.changed()
    assert watch.mark() and not watch.changed()  # taken in: the new directories are watched now
    (root / "fresh" / "inner" / "f.txt").write_text("x\n")
    assert watch.changed()
    assert watch.mark() and not watch.changed()
    (root / "src").rename(root / "source")  # a directory renamed: armed again from the top
    assert watch.changed()
    assert watch.mark() and not watch.changed()
    (root / "source" / "deep" / "c.txt").write_text("c\n")
    assert watch.changed()
    watch.close()


REPLACED = {
    "root moved away, another made": lambda r: (r.rename(r.with_name("elsewhere")), r.mkdir()),
    "root deleted, made again": lambda r: (__import__("shutil").rmtree(r), r.mkdir()),
    "root with no .git deleted, made again": lambda r: (__import__("shutil").rmtree(r), r.mkdir()),
    "root/.git deleted, made again": lambda r: (__import__("shutil").rmtree(r / ".git"), (r / ".git" / "info").mkdir(parents=True)),
}


@pytest.mark.parametrize("replace", REPLACED)
def test_what_lies_at_the_path_after_it_was_replaced_is_what_is_watched(tmp_path: Path, replace: str) -> None:
    # A mark after root (or root/.git) left its path watches the directory there now: `rm -rf
    # project && git clone ... project` leaves the old watches on inodes nobody uses any more.
    root = _tree(tmp_path / "work")
    if "no .git" in replace:
        __import__("shutil").rmtree(root / ".git")  # nothing under root/.git to tell the delete on the way
    watch = _watch(root)
    REPLACED[replace](root)
    assert watch.changed()
    assert watch.mark(), watch.unarmed
    assert not watch.changed()
    if replace.startswith("root/.git"):
        (root / ".git" / "info" / "exclude").write_text("*.txt\n")
    else:
        (root / "new.txt").write_text("in the directory now at root's path\n")
    assert watch.changed()
    watch.close()


def test_a_tree_it_cannot_vouch_for_is_always_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "work")
    big = tw.TreeWatch(str(root), max_dirs=3)
    assert not big.mark() and "more than 3 directories" in big.unarmed
    assert big.changed() and big.changed()
    monkeypatch.setattr(tw, "fs_type", lambda path: "nfs4")
    remote = tw.TreeWatch(str(root))
    assert not remote.mark() and "nfs4" in remote.unarmed and remote.changed()


MOUNTINFO = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:26 / /work/hung rw,nosuid shared:9 - fuse.hung hung rw,user_id=0
31 22 0:27 / /work/my\\040docs rw shared:10 - nfs4 srv:/docs rw
"""


def test_a_tree_with_a_file_system_mounted_inside_is_never_walked() -> None:
    """Another mount below the tree could hang a listing (a stuck FUSE mount) and is another
    file system's changes: the watch is not armed, git records the tree as before."""
    assert tw.fs_type("/work", MOUNTINFO) == "mounts inside"
    assert tw.fs_type("/", MOUNTINFO) == "mounts inside"
    assert tw.fs_type("/work/src", MOUNTINFO) == "ext4"
    assert tw.fs_type("/work/hung/deeper", MOUNTINFO) == "fuse.hung"
    assert tw.fs_type("/work/my docs", MOUNTINFO) == "nfs4"
    assert "mounts inside" not in tw.LOCAL_FS


def test_agentd_takes_no_more_than_its_share_of_the_users_inotify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most MAX_INSTANCES trees are watched; a new one takes the share of the one used longest
    ago (which then says "changed" until marked again), never that of a watch in use."""
    monkeypatch.setattr(tw, "_used", {"instances": 0, "watches": 0})  # other tests' shadows in this process
    monkeypatch.setattr(tw, "_armed", {})
    watches = [tw.TreeWatch(str(_tree(tmp_path / f"w{i}"))) for i in range(tw.MAX_INSTANCES + 2)]
    assert all(w.mark() for w in watches[:tw.MAX_INSTANCES])
    assert not any(w.changed() for w in watches[1:tw.MAX_INSTANCES])  # w0 is now the least recently used
    assert watches[tw.MAX_INSTANCES].mark(), "a new tree takes the least recently used share"
    assert tw._used["instances"] == tw.MAX_INSTANCES
    assert watches[0].changed() and "used more recently" in watches[0].unarmed
    assert not any(w.changed() for w in watches[1:tw.MAX_INSTANCES + 1]), "only that one gave its share up"
    # A watch in use (its owner in mark or changed) is never the one evicted: w1 is the oldest now.
    with watches[1]._busy:
        assert watches[tw.MAX_INSTANCES + 1].mark()
    assert not watches[1].changed() and watches[2].changed()
    assert watches[0].mark() and watches[0].armed, "an evicted watch arms again on its next mark"
    (tmp_path / "w0" / "new.txt").write_text("x")
    assert watches[0].changed()
    for w in watches:
        w.close()
    assert tw._used == {"instances": 0, "watches": 0} and tw._armed == {}


def test_when_every_share_is_in_use_the_new_tree_is_not_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tw, "_used", {"instances": 0, "watches": 0})
    monkeypatch.setattr(tw, "_armed", {})
    watches = [tw.TreeWatch(str(_tree(tmp_path / f"w{i}"))) for i in range(tw.MAX_INSTANCES + 1)]
    assert all(w.mark() for w in watches[:-1])
    for w in watches[:-1]:
        w._busy.acquire()
    try:
        assert not watches[-1].mark() and "all in use" in watches[-1].unarmed and watches[-1].changed()
    finally:
        for w in watches[:-1]:
            w._busy.release()
    assert not any(w.changed() for w in watches[:-1])
    for w in watches:
        w.close()
    assert tw._used == {"instances": 0, "watches": 0}


def test_the_watch_share_is_taken_from_the_least_recently_used_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tw, "_used", {"instances": 0, "watches": 0})
    monkeypatch.setattr(tw, "_armed", {})
    monkeypatch.setattr(tw, "MAX_WATCHES", 6)
    old, new = tw.TreeWatch(str(_tree(tmp_path / "old"))), tw.TreeWatch(str(_tree(tmp_path / "new")))
    assert old.mark() and 1 < tw._used["watches"] <= 6
    assert new.mark(), "the new tree's directories take the old tree's watches"
    assert old.changed() and not new.changed()
    assert tw._used["watches"] == len(new._paths) and tw._used["instances"] == 1
    old.close()
    new.close()


def _content(root: Path) -> str:
    """Everything a checkpoint could record of ``root``: names, types, modes, contents."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            h.update(f"{os.path.relpath(path, root)}\0{st.st_mode}\0".encode())
            if os.path.isfile(path) and not os.path.islink(path):
                h.update(Path(path).read_bytes())
    return h.hexdigest()


def test_random_changes_never_pass_for_unchanged(tmp_path: Path) -> None:
    """The property the checkpoints rely on: whenever the tree differs from what it was at the
    last mark, the watch says changed (it may say so more often, never less)."""
    rng = random.Random(7)
    root = tmp_path / "work"
    root.mkdir()
    watch = tw.TreeWatch(str(root))
    assert watch.mark()
    at_mark = _content(root)

    def dirs() -> list[Path]:
        return [Path(d) for d, _, _ in os.walk(root)]

    def files() -> list[Path]:
        return [Path(d) / f for d, _, fs in os.walk(root) for f in fs]

    for step in range(600):
        op = rng.choice(["mkdir", "write", "append", "rm", "mvfile", "mvdir", "chmod", "rmdir", "mark", "mark", "nothing"])
        if op == "mkdir":
            (rng.choice(dirs()) / f"d{step}").mkdir()
        elif op == "write":
            (rng.choice(dirs()) / f"f{step}").write_text(str(step))
        elif op == "append" and files():
            with open(rng.choice(files()), "a") as f:
                f.write("x")
        elif op == "rm" and files():
            rng.choice(files()).unlink()
        elif op == "mvfile" and files():
            rng.choice(files()).rename(rng.choice(dirs()) / f"m{step}")
        elif op == "mvdir" and len(dirs()) > 1:
            src = rng.choice(dirs()[1:])
            dst = rng.choice([d for d in dirs() if src not in d.parents and d != src])
            src.rename(dst / f"md{step}")
        elif op == "chmod" and files():
            os.chmod(rng.choice(files()), rng.choice([0o644, 0o755]))
        elif op == "rmdir":
            empty = [d for d in dirs()[1:] if not any(d.iterdir())]
            if empty:
                rng.choice(empty).rmdir()
        elif op == "mark":
            assert watch.mark(), watch.unarmed
            at_mark = _content(root)
        if _content(root) != at_mark:
            assert watch.changed(), f"step {step} ({op}) changed the tree unseen"
    watch.close()


def test_a_checkpoint_of_an_unchanged_tree_runs_no_git_and_a_change_runs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tw, "_used", {"instances": 0, "watches": 0})
    monkeypatch.setattr(tw, "_armed", {})
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "big.txt").write_text("x" * 20)
    shadows = {on: cp._Shadow(tmp_path / f"state-{on}" / "checkpoints", str(work),
                              CheckpointsConfig(max_file_bytes=10, watch=on), tmp_path / f"state-{on}")
               for on in (True, False)}
    runs: dict[bool, list[str]] = {True: [], False: []}
    for on, shadow in shadows.items():
        git = shadow.git

        async def counted(*args: str, _git=git, _on=on, **kw: object) -> bytes:
            runs[_on].append(args[0])
            return await _git(*args, **kw)  # type: ignore[arg-type]

        shadow.git = counted  # type: ignore[method-assign]

    async def record(shadow: cp._Shadow) -> cp._Job:
        job = cp._Job("c1", "")
        await shadow.record(job)
        assert len(job.tree) == 40, job.error
        return job

    async def main() -> None:
        for on, shadow in shadows.items():
            first = await record(shadow)
            count = len(runs[on])
            again = await record(shadow)
            assert (again.tree, again.too_large) == (first.tree, ["big.txt"])
            assert len(runs[on]) == (count if on else count + 1), runs[on]  # watched: no git at all
            (work / "a.txt").write_text(f"c{on:d}\n")  # under max_file_bytes
            changed = await record(shadow)
            assert changed.tree != first.tree and len(runs[on]) > count + (0 if on else 1)
            out = await shadow.git("cat-file", "-p", f"{changed.tree}:a.txt")
            assert out == f"c{on:d}\n".encode()
            if shadow._watch is not None:
                shadow._watch.close()

    trio.run(main)
