"""agentd's per-turn file checkpoints through a real daemon and the script provider (whose tools
really run ``bash -c`` in the workdir): ``agentctl diff`` shows what a turn changed, ``agentctl
revert`` puts it back, and the user's own git repository is never written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

from agentd import wire
from daemon_harness import Daemon

SCRIPT = '''
model = "edit"
delay_ms = 0

[[turn]]
match = "first"
[[turn.step]]
kind = "tool"
name = "bash"
command = "echo new > new.txt && echo changed >> tracked.txt && rm gone.txt && echo junk > build.log && mkdir -p sub/deep && echo x > sub/deep/f.txt && echo done"
[[turn.step]]
kind = "text"
text = "done"

[[turn]]
match = "second"
[[turn.step]]
kind = "tool"
name = "bash"
command = "echo again >> new.txt && echo done"

[[turn]]
match = "big"
[[turn.step]]
kind = "tool"
name = "bash"
command = "head -c 5000 /dev/zero | tr '\\\\0' a > big.txt && echo small > small.txt && echo done"

[[turn]]
match = "hold"
[[turn.step]]
kind = "tool"
name = "bash"
command = "echo partial > partial.txt && echo done"
[[turn.step]]
kind = "wait"
until = "steer"

[[turn]]
match = "folders"
[[turn.step]]
kind = "tool"
name = "bash"
command = "mkdir -p empty/made && echo x > empty/made/f.txt && mkdir -p fresh/a && echo y > fresh/a/g.txt && echo done"

[[turn]]
match = "dropdir"
[[turn.step]]
kind = "tool"
name = "bash"
command = "rm -r big && echo done"

[[turn]]
match = "makeblob"
[[turn.step]]
kind = "tool"
name = "bash"
command = "head -c 5000 /dev/zero | tr '\\\\0' a > big && echo done"

[[turn]]
match = "nothing"
[[turn.step]]
kind = "text"
text = "no files"
'''


#: a time bound a loaded test machine never reaches (the default is 0.15 s)
ROOMY = "[checkpoints]\ntimeout_s = 30\n"


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _user_repo(work: Path) -> None:
    """A user's repository: a commit, an ignored pattern, a hook, a stash, a branch."""
    _git(work, "init", "-q", "-b", "main")
    (work / "tracked.txt").write_text("tracked\n")
    (work / "gone.txt").write_text("to be removed\n")
    (work / ".gitignore").write_text("*.log\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "one")
    (work / "tracked.txt").write_text("tracked\nstashed\n")
    _git(work, "stash", "-q")
    _git(work, "branch", "side")
    hook = work / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)


def _tree_state(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root``: (mode, mtime_ns, sha256) — any write shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns if digest else 0, digest)
    return out


def _new(d: Daemon, work: Path, script: Path) -> str:
    out = d.agentctl("--json", "new", "-p", "script", "-m", str(script), "--cwd", str(work))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["id"]


def _turn(d: Daemon, cid: str, text: str) -> str:
    """Run one turn to its end; its run id."""
    out = d.agentctl("--json", "send", cid, text, "--follow")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    return next(line["run"] for line in lines if line.get("run"))


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def _checkpoints(d: Daemon, cid: str) -> list[tuple[str, wire.CheckpointRecord]]:
    return [(r["run"] if "run" in r else "", msgspec.convert(r["data"], wire.CheckpointRecord))
            for r in d.journal(cid) if r["type"] == "checkpoint"]


def test_diff_and_revert_of_a_turn_honour_gitignore_and_never_touch_the_users_git(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _user_repo(work)
    (work / "untracked-before.txt").write_text("the user's own untracked file\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    git_before = _tree_state(work / ".git")
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "first")
        res = _json(d.agentctl("--json", "diff", cid))  # waits for the after-state being recorded
        # Typed records, one before and one after the turn, both with a tree.
        cps = _checkpoints(d, cid)
        assert [(r, c.step, c.phase) for r, c in cps] == [(run, run, "before"), (run, run, "after")]
        kinds = [r["type"] for r in d.journal(cid)]
        assert kinds[-2:] == ["checkpoint", "turn"]  # the turn's end stays its last record
        assert all(len(c.tree) == 40 and not c.skipped for _, c in cps)
        assert res["run"] == run and res["kind"] == "turn" and res["after"] == "checkpoint"
        status = {f["path"]: f["status"] for f in res["files"]}
        # build.log is ignored by the user's .gitignore; their untracked file was already there.
        assert status == {"new.txt": "added", "tracked.txt": "modified", "gone.txt": "deleted",
                          "sub/deep/f.txt": "added"}
        tracked = next(f for f in res["files"] if f["path"] == "tracked.txt")
        assert tracked["additions"] == 1 and tracked["hunks"][0]["lines"] == [" tracked", "+changed"]
        assert "+new" in res["patch"] and "diff --git a/gone.txt b/gone.txt" in res["patch"]
        human = d.agentctl("diff", cid, "--run", run)
        assert human.returncode == 0 and "+changed" in human.stdout and "4 files changed" in human.stderr
        # A unique prefix of the run id names it, as conversation ids and fork --at take one.
        assert d.agentctl("diff", cid, "--run", run[:5]).stdout == human.stdout
        assert d.agentctl("diff", cid, "--run", "1").stdout == human.stdout  # the first turn, by number
        past = d.agentctl("diff", cid, "--run", "9")
        assert past.returncode == 6 and "no turn 9" in past.stderr
        stat = d.agentctl("diff", cid, "--stat")
        assert stat.returncode == 0 and " A new.txt " in stat.stdout and "+++" not in stat.stdout

        # Without a terminal, revert wants --yes; --dry-run says what it would do.
        assert d.agentctl("revert", cid, "--run", run).returncode == 2
        plan = _json(d.agentctl("--json", "revert", cid, "--run", run, "--dry-run"))
        assert plan["dry_run"] and {f["path"]: f["action"] for f in plan["files"]} == {
            "new.txt": "delete", "tracked.txt": "restore", "gone.txt": "create", "sub/deep/f.txt": "delete"}
        assert (work / "new.txt").exists()
        shown = d.agentctl("revert", cid, "--run", run, "--dry-run")
        assert shown.returncode == 0 and "  delete  new.txt" in shown.stdout
        assert f"dry run: reverting {run} would change these 4 files; nothing changed" in shown.stderr

        rev = _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        vid = rev["revert"]
        assert vid.startswith("v")
        assert not (work / "new.txt").exists() and not (work / "sub").exists()
        assert (work / "tracked.txt").read_text() == "tracked\n"
        assert (work / "gone.txt").read_text() == "to be removed\n"
        assert (work / "build.log").read_text() == "junk\n"  # ignored: never recorded, left alone
        assert (work / "untracked-before.txt").exists()
        kinds = [r["type"] for r in d.journal(cid)][-3:]
        assert kinds == ["checkpoint", "revert", "checkpoint"]
        told = d.agentctl("tail", cid, "--no-follow")  # the transcript says so, and how to undo it
        assert f"reverted {run}: 4 files (undo: agentctl revert {cid} --run {vid})" in told.stdout
        assert _json(d.agentctl("--json", "diff", cid))["kind"] == "revert"

        # A revert is revertable: the turn's changes come back.
        again = _json(d.agentctl("--json", "revert", cid, "--run", vid, "--yes"))
        assert again["revert"] and again["revert"] != vid
        assert (work / "new.txt").read_text() == "new\n" and (work / "sub/deep/f.txt").read_text() == "x\n"
        assert (work / "tracked.txt").read_text() == "tracked\nchanged\n" and not (work / "gone.txt").exists()

        # The next turn's diff is that turn's alone.
        run2 = _turn(d, cid, "second")
        res2 = _json(d.agentctl("--json", "diff", cid))
        assert res2["run"] == run2 and [f["path"] for f in res2["files"]] == ["new.txt"]
        nothing = _json(d.agentctl("--json", "revert", cid, "--run", run2, "--yes"))
        assert nothing["revert"] and (work / "new.txt").read_text() == "new\n"
        assert _json(d.agentctl("--json", "revert", cid, "--run", run2, "--yes"))["files"] == []

        assert d.agentctl("diff", cid, "--run", "r000000000000").returncode == 6
    finally:
        d.stop()
    # Not one byte of the user's .git changed: refs, index, stash, hooks, config, objects.
    assert _tree_state(work / ".git") == git_before
    assert _git(work, "stash", "list").count("\n") == 1
    assert _git(work, "status", "--porcelain", "--untracked-files=no") == " D gone.txt\n M tracked.txt\n"


def test_a_file_over_the_size_bound_is_left_out_and_left_alone(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY + "max_file_bytes = 1000\n").start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "big")
        assert d.agentctl("diff", cid).returncode == 0
        after = [c for _, c in _checkpoints(d, cid) if c.phase == "after"][0]
        assert after.too_large == ["big.txt"]
        res = _json(d.agentctl("--json", "diff", cid))
        assert [f["path"] for f in res["files"]] == ["small.txt"] and res["too_large"] == ["big.txt"]
        assert "big.txt" in d.agentctl("diff", cid).stderr
        rev = _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        assert [f["path"] for f in rev["files"]] == ["small.txt"]
        assert not (work / "small.txt").exists() and (work / "big.txt").stat().st_size == 5000
    finally:
        d.stop()


def test_revert_keeps_a_folder_that_was_there_empty_and_removes_the_folders_the_turn_made(tmp_path: Path) -> None:
    # No git tree records an empty folder: its birth time says it was there before the turn.
    work = tmp_path / "work"
    (work / "empty").mkdir(parents=True)
    (work / "also-empty" / "inner").mkdir(parents=True)
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "folders")
        assert (work / "empty" / "made" / "f.txt").exists() and (work / "fresh" / "a" / "g.txt").exists()
        rev = _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        assert sorted(f["path"] for f in rev["files"]) == ["empty/made/f.txt", "fresh/a/g.txt"]
        assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == ["also-empty", "also-empty/inner", "empty"]
    finally:
        d.stop()
    # The same when the steps are read back from the journal: a turn, then a restart, then the revert.
    run = ""
    d.start()
    try:
        run = _turn(d, cid, "folders")
    finally:
        d.stop()
    d.start()
    try:
        _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == ["also-empty", "also-empty/inner", "empty"]
    finally:
        d.stop()


def test_revert_never_deletes_an_unrecorded_file_standing_where_a_folder_comes_back(tmp_path: Path) -> None:
    # A step removed big/; a later one made big a file over max_file_bytes (never recorded): putting
    # big/y back would delete it, and no checkpoint could bring it back.
    work = tmp_path / "work"
    (work / "big").mkdir(parents=True)
    (work / "big" / "y").write_text("old\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY + "max_file_bytes = 1000\n").start()
    try:
        cid = _new(d, work, script)
        dropped = _turn(d, cid, "dropdir")
        _turn(d, cid, "makeblob")
        refused = d.agentctl("revert", cid, "--run", dropped, "--yes")
        assert refused.returncode == 8 and "'big/y'" in refused.stderr and "in place of one of its folders" in refused.stderr
        assert (work / "big").is_file() and (work / "big").stat().st_size == 5000
        (work / "big").unlink()  # moved away: now it reverts (the first turn, named by its number)
        assert _json(d.agentctl("--json", "revert", cid, "--run", "1", "--yes"))["run"] == dropped
        assert (work / "big" / "y").read_text() == "old\n"
    finally:
        d.stop()


def test_revert_writes_only_into_the_directory_it_recorded_never_through_a_symlink_put_in_its_place(
        tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "new.txt").write_text("someone else's\n")
    (outside / "tracked.txt").write_text("someone else's\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        (work / "tracked.txt").write_text("tracked\n")
        (work / "gone.txt").write_text("to be removed\n")
        run = _turn(d, cid, "first")
        work.rename(tmp_path / "work.old")
        work.symlink_to(outside)
        refused = d.agentctl("revert", cid, "--run", run, "--yes")
        assert refused.returncode == 8 and "is not the directory recorded before it" in refused.stderr
        assert sorted(p.name for p in outside.iterdir()) == ["new.txt", "tracked.txt"]
        assert all(p.read_text() == "someone else's\n" for p in outside.iterdir())
        work.unlink()
        (tmp_path / "work.old").rename(work)  # the directory itself again: it reverts
        _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        assert not (work / "new.txt").exists() and (work / "gone.txt").exists()
    finally:
        d.stop()


def test_revert_waits_for_another_conversations_turn_in_the_same_working_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        mine, other = _new(d, work, script), _new(d, work, script)
        first = _turn(d, mine, "first")
        with d.client() as client:
            client.subscribe(other, after=0)
            run = client.request(wire.Send, conversation=other, text="hold on")["run"]
            deadline = time.monotonic() + 20
            while not (work / "partial.txt").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            busy = d.agentctl("revert", mine, "--run", first, "--yes")
            assert busy.returncode == 7 and other in busy.stderr and "same working directory" in busy.stderr
            assert (work / "new.txt").exists()  # nothing was reverted
            client.request(wire.Steer, conversation=other, text="go on")
            client.follow(run)
        _json(d.agentctl("--json", "revert", mine, "--run", first, "--yes"))
        assert not (work / "new.txt").exists()
    finally:
        d.stop()


def test_revert_is_refused_busy_while_a_turn_runs_and_diff_shows_its_changes_so_far(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        first = _turn(d, cid, "first")
        with d.client() as client:
            client.subscribe(cid, after=d.journal(cid)[-1]["seq"])
            run = client.request(wire.Send, conversation=cid, text="hold on")["run"]
            for _ in range(400):
                if (work / "partial.txt").exists():
                    break
                import time

                time.sleep(0.05)
            busy = d.agentctl("revert", cid, "--run", first, "--yes")
            assert busy.returncode == 7, busy.stderr
            assert "running" in busy.stderr
            assert (work / "new.txt").exists()  # nothing was reverted
            now = _json(d.agentctl("--json", "diff", cid))
            assert now["run"] == run and now["after"] == "now"
            assert [f["path"] for f in now["files"]] == ["partial.txt"]
            client.request(wire.Steer, conversation=cid, text="go on")
            client.follow(run)
        done = _json(d.agentctl("--json", "diff", cid))
        assert done["after"] == "checkpoint" and [f["path"] for f in done["files"]] == ["partial.txt"]
        assert _json(d.agentctl("--json", "revert", cid, "--run", first, "--yes"))["revert"]
    finally:
        d.stop()


def test_a_checkpoint_past_its_time_bound_is_skipped_and_the_turn_goes_on(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(300):
        (work / f"f{i}.txt").write_text(f"{i}\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, "[checkpoints]\ntimeout_s = 0.000001\n").start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "nothing")
        ends = [r for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] == "completed"]
        assert len(ends) == 1
        before = [c for _, c in _checkpoints(d, cid) if c.phase == "before"]
        assert before and before[0].skipped == "timeout" and not before[0].tree
        missing = d.agentctl("diff", cid, "--run", run)
        assert missing.returncode == 6 and "skipped: timeout" in missing.stderr
    finally:
        d.stop()


def test_an_after_state_past_its_time_bound_is_journaled_once_recorded_and_revert_leaves_later_edits_alone(
        tmp_path: Path) -> None:
    # With the after-state skipped, diff and revert took the state of now: a revert undid the
    # user's own later edits to files the turn never touched.
    work = tmp_path / "work"
    work.mkdir()
    for i in range(300):
        (work / f"f{i}.txt").write_text(f"{i}\n")
    (work / "tracked.txt").write_text("tracked\n")
    (work / "gone.txt").write_text("to be removed\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, "[checkpoints]\ntimeout_s = 0.000001\n").start()
    try:
        cid = _new(d, work, script)
        _turn(d, cid, "nothing")  # its checkpoints are late: the shadow repository is there after it
        deadline = time.monotonic() + 20
        while not any(c.tree for _, c in _checkpoints(d, cid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run = _turn(d, cid, "first")  # its before-state unchanged (no git run), its after-state late
        while not [c for _, c in _checkpoints(d, cid) if c.step == run and c.phase == "after" and c.tree]:
            assert time.monotonic() < deadline, _checkpoints(d, cid)
            time.sleep(0.05)
        after = [(tag, c) for tag, c in _checkpoints(d, cid) if c.step == run and c.phase == "after"]
        assert after[0][1].skipped == "timeout" and after[-1][0] == "" and after[-1][1].tree  # journaled after the end
        (work / "f7.txt").write_text("the user's own edit, after the turn\n")
        diff = _json(d.agentctl("--json", "diff", cid, "--run", run, "--stat"))
        assert diff["after"] == "checkpoint" and "f7.txt" not in {f["path"] for f in diff["files"]}
        reverted = _json(d.agentctl("--json", "revert", cid, "--run", run, "--yes"))
        assert "f7.txt" not in {f["path"] for f in reverted["files"]} and (work / "tracked.txt").read_text() == "tracked\n"
        assert (work / "f7.txt").read_text() == "the user's own edit, after the turn\n"
    finally:
        d.stop()


def test_revert_names_the_files_changed_since_the_turn_whose_changes_it_undoes_too(tmp_path: Path) -> None:
    # A revert of a turn takes its files back to before it: an edit made since (by hand, by a
    # later turn) goes too. The plan said nothing of it; now each such file is marked.
    work = tmp_path / "work"
    work.mkdir()
    (work / "tracked.txt").write_text("tracked\n")
    (work / "gone.txt").write_text("to be removed\n")
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "first")
        (work / "new.txt").write_text("the user's own edit, after the turn\n")
        plan = _json(d.agentctl("--json", "revert", cid, "--run", run, "--dry-run"))
        since = {f["path"]: f["changed_since"] for f in plan["files"]}
        assert since["new.txt"] is True and since["tracked.txt"] is False, plan
        human = d.agentctl("revert", cid, "--run", run, "--dry-run")
        assert human.returncode == 0, human.stderr
        assert "delete  new.txt  (changed since)" in human.stdout
        assert f"1 of these files was changed after {run}: reverting undoes those changes too" in human.stderr
        assert (work / "new.txt").read_text() == "the user's own edit, after the turn\n"  # a dry run
    finally:
        d.stop()


def test_checkpoints_off_takes_none_and_reports_the_capability_false(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, "[checkpoints]\nenabled = false\n").start()
    try:
        caps = {p["name"]: p["capabilities"] for p in _json(d.agentctl("--json", "providers"))["providers"]}
        assert caps["script"].get("checkpoints", False) is False
        cid = _new(d, work, script)
        run = _turn(d, cid, "first")
        assert not _checkpoints(d, cid)
        assert d.agentctl("diff", cid).returncode == 6
        assert d.agentctl("revert", cid, "--run", run, "--yes").returncode == 1
    finally:
        d.stop()
    d = Daemon(tmp_path, ROOMY).start()
    try:
        caps = {p["name"]: p["capabilities"] for p in _json(d.agentctl("--json", "providers"))["providers"]}
        assert caps["script"]["checkpoints"] is True
    finally:
        d.stop()


def test_revert_at_a_terminal_shows_what_it_changes_and_asks_first(tmp_path: Path) -> None:
    import sys

    from daemon_harness import drive_pty

    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "edit.toml"
    script.write_text(SCRIPT)
    d = Daemon(tmp_path, ROOMY).start()
    try:
        cid = _new(d, work, script)
        run = _turn(d, cid, "second")  # creates new.txt
        argv = [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "revert", cid, "--run", run]
        code, out = drive_pty(argv, d.env, d.root, [("Go on?", "n")])
        assert code == 1 and "delete  new.txt" in out and "nothing changed" in out, out
        assert (work / "new.txt").exists()
        code, out = drive_pty(argv, d.env, d.root, [("Go on?", "y")])
        assert code == 0 and f"reverted {run} as v" in out, out
        assert not (work / "new.txt").exists()
    finally:
        d.stop()
