"""agentd.agentfs: agent file access confined beneath a pinned workdir, with openat2 and with the walk.

The daemon-level proofs (a real ACP agent racing symlinks, a FIFO, a hung file
system) are in tests/reliability/test_agent_files.py; these pin down the rules.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentd import agentfs
from environment import unavailable


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "openat2":
        if not agentfs.openat2_available():
            unavailable("this kernel (or its seccomp filter) has no openat2")
    else:
        monkeypatch.setattr(agentfs, "_openat2_state", False)
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("top secret\n")
    (work / "inside.txt").write_text("inside\n")
    (work / "sub" / "deep.txt").write_text("deep\n")
    (work / "link-out").symlink_to(tmp_path / "outside")
    (work / "secret-link.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (work / "sub" / "up").symlink_to("../..")
    (work / "inner").symlink_to(work / "sub")  # points inside, still not followed
    (tmp_path / "work-sibling").mkdir()
    (tmp_path / "work-sibling" / "x.txt").write_text("sibling\n")
    return work


def policy(**kw: object) -> agentfs.Policy:
    return agentfs.Policy(**kw)  # type: ignore[arg-type]


async def test_reads_inside_by_absolute_or_relative_path(mode: str, tree: Path) -> None:
    files = await agentfs.pin(str(tree), policy())
    try:
        assert await files.read_text(str(tree / "inside.txt")) == "inside\n"
        assert await files.read_text("inside.txt") == "inside\n"
        assert await files.read_text("sub/../sub/deep.txt") == "deep\n"
        assert await files.read_text(str(tree / "sub" / ".." / "inside.txt")) == "inside\n"
        with pytest.raises(FileNotFoundError):
            await files.read_text("missing.txt")
        with pytest.raises(FileNotFoundError):
            await files.read_text("nodir/missing.txt")
    finally:
        files.close()


@pytest.mark.parametrize("path", [
    "../outside/secret.txt", "{tmp}/outside/secret.txt", "link-out/secret.txt", "secret-link.txt",
    "sub/up/outside/secret.txt", "sub/../../outside/secret.txt", "/etc/passwd", "/proc/self/environ",
    "{tmp}/work-sibling/x.txt", "inner/deep.txt", "..", "",
])
async def test_every_way_out_is_refused(mode: str, tree: Path, path: str) -> None:
    files = await agentfs.pin(str(tree), policy())
    try:
        with pytest.raises(agentfs.Refused) as err:
            await files.read_text(path.replace("{tmp}", str(tree.parent)))
        assert "top secret" not in str(err.value)
        with pytest.raises(agentfs.Refused):
            await files.write_text(path.replace("{tmp}", str(tree.parent)), "pwned")
    finally:
        files.close()
    assert sorted(p.name for p in (tree.parent / "outside").iterdir()) == ["secret.txt"]
    assert (tree.parent / "outside" / "secret.txt").read_text() == "top secret\n"
    assert (tree / "sub" / "deep.txt").read_text() == "deep\n"


async def test_the_pinned_workdir_stays_the_one_opened_when_it_is_swapped_for_a_link(mode: str, tree: Path) -> None:
    files = await agentfs.pin(str(tree), policy())
    try:
        tree.rename(tree.with_name("work-moved"))
        tree.symlink_to(tree.parent / "outside")  # the workdir's name now leads out
        (tree.parent / "outside" / "inside.txt").write_text("outside copy\n")
        assert await files.read_text(str(tree / "inside.txt")) == "inside\n"
        await files.write_text("inside.txt", "changed\n")
        assert (tree.parent / "outside" / "inside.txt").read_text() == "outside copy\n"
        assert (tree.with_name("work-moved") / "inside.txt").read_text() == "changed\n"
    finally:
        files.close()


async def test_line_windows(mode: str, tree: Path) -> None:
    (tree / "lines.txt").write_text("1\n2\n3\n4")
    files = await agentfs.pin(str(tree), policy())
    try:
        assert await files.read_text("lines.txt", line=2, limit=2) == "2\n3\n"
        assert await files.read_text("lines.txt", line=4) == "4"
        assert await files.read_text("lines.txt", limit=1) == "1\n"
        assert await files.read_text("lines.txt", line=9) == ""
        assert await files.read_text("lines.txt", limit=0) == ""
    finally:
        files.close()


async def test_past_the_ceiling_is_refused_and_a_window_before_it_is_not(mode: str, tree: Path) -> None:
    (tree / "exact.txt").write_bytes(b"x" * 100)
    (tree / "over.txt").write_bytes(b"line\n" * 20 + b"y")  # 101 bytes
    files = await agentfs.pin(str(tree), policy(max_bytes=100))
    try:
        assert await files.read_text("exact.txt") == "x" * 100
        with pytest.raises(agentfs.TooLarge):
            await files.read_text("over.txt")
        assert await files.read_text("over.txt", line=2, limit=1) == "line\n"
        with pytest.raises(agentfs.TooLarge):
            await files.read_text("over.txt", line=21)
        with pytest.raises(agentfs.TooLarge):
            await files.write_text("big.txt", "z" * 101)
        assert not (tree / "big.txt").exists()
    finally:
        files.close()


async def test_fifos_devices_sockets_and_directories_are_refused(mode: str, tree: Path) -> None:
    os.mkfifo(tree / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tree / "sock"))
    devices = []
    if os.geteuid() == 0:
        os.mknod(tree / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
        devices.append("zero")
    files = await agentfs.pin(str(tree), policy())
    try:
        for name in ["fifo", "sock", "sub", ".", *devices]:
            with pytest.raises(agentfs.NotRegular):
                await files.read_text(name)
            with pytest.raises(agentfs.NotRegular):
                await files.write_text(name, "x")
    finally:
        files.close()
        sock.close()
    assert stat.S_ISFIFO((tree / "fifo").lstat().st_mode)


async def test_a_write_replaces_a_hard_link_and_keeps_the_mode(mode: str, tree: Path) -> None:
    outside = tree.parent / "outside" / "secret.txt"
    os.link(outside, tree / "hard.txt")
    (tree / "script.sh").write_text("old")
    os.chmod(tree / "script.sh", 0o751)
    files = await agentfs.pin(str(tree), policy())
    try:
        await files.write_text("hard.txt", "pwned")
        await files.write_text("script.sh", "new")
        await files.write_text("a/b/c.txt", "made")
        with pytest.raises(agentfs.Refused):
            await files.write_text("secret-link.txt", "pwned")
    finally:
        files.close()
    assert outside.read_text() == "top secret\n"
    assert (tree / "hard.txt").read_text() == "pwned" and (tree / "hard.txt").stat().st_nlink == 1
    assert (tree / "script.sh").read_text() == "new" and stat.S_IMODE((tree / "script.sh").stat().st_mode) == 0o751
    assert (tree / "a" / "b" / "c.txt").read_text() == "made"
    assert (tree / "secret-link.txt").is_symlink()
    assert not [p for p in tree.rglob(".agentd-*")], "a temporary file was left behind"


async def test_agentds_own_directories_and_files_are_refused_inside_the_workdir(mode: str, tree: Path) -> None:
    state = tree / ".local" / "state" / "agentd"
    (state / "conversations").mkdir(parents=True)
    (state / "conversations" / "record.json").write_text("{}")
    (tree / "agentd.toml").write_text("[log]\n")
    files = await agentfs.pin(str(tree), policy(own_dirs=(str(state),), own_files=(str(tree / "agentd.toml"),)))
    try:
        for path in (state / "conversations" / "record.json", state / "new.txt", state / "conversations" / "x" / "y"):
            with pytest.raises(agentfs.Refused) as err:
                await files.read_text(str(path))
            assert err.value.kind == "agentd"
            with pytest.raises(agentfs.Refused):
                await files.write_text(str(path), "pwned")
        # Moved under another name, it is still agentd's (compared by inode, not by name).
        state.rename(tree / "renamed")
        with pytest.raises(agentfs.Refused):
            await files.read_text("renamed/conversations/record.json")
        with pytest.raises(agentfs.Refused):
            await files.read_text("agentd.toml")
    finally:
        files.close()
    assert (tree / "renamed" / "conversations" / "record.json").read_text() == "{}"
    assert not (tree / "renamed" / "new.txt").exists() and not (tree / "renamed" / "conversations" / "x").exists()


async def test_a_workdir_inside_agentds_state_gets_no_file_access(mode: str, tmp_path: Path) -> None:
    work = tmp_path / "state" / "work"
    work.mkdir(parents=True)
    (work / "a.txt").write_text("a")
    files = await agentfs.pin(str(work), policy(own_dirs=(str(tmp_path / "state"),)))
    try:
        with pytest.raises(agentfs.Refused):
            await files.read_text("a.txt")
    finally:
        files.close()


async def test_attachments_outside_are_readable_as_the_file_allowed_and_nothing_else(mode: str, tree: Path) -> None:
    att = tree.parent / "outside" / "att.txt"
    att.write_text("attached")
    files = await agentfs.pin(str(tree), policy())
    try:
        await files.allow([str(att), str(tree.parent / "missing")])
        assert await files.read_text(str(att)) == "attached"
        with pytest.raises(agentfs.Refused):
            await files.write_text(str(att), "changed")
        att.unlink()
        att.symlink_to(tree.parent / "outside" / "secret.txt")
        with pytest.raises(OSError):  # the link is not followed, and another file is not the attachment
            await files.read_text(str(att))
    finally:
        files.close()


async def test_a_closed_workdir_refuses_requests(mode: str, tree: Path) -> None:
    files = await agentfs.pin(str(tree), policy())
    files.close()
    files.close()
    with pytest.raises(agentfs.FileAccessError):
        await files.read_text("inside.txt")
