"""What a per-turn checkpoint (agentd.checkpoints) costs: recording a 10,000-file working
directory in the shadow git repository, unchanged and with 10 files changed since the last one.

The figure is one recording as a turn waits for it (``ls-files``, ``update-index`` when
something changed, ``write-tree``, the ref), warm (the tree was recorded once before, as it
is after a conversation's first turn). The baseline, in the same run, is ``git status
--porcelain`` of the same tree as a committed repository of its own: what the user's own git
pays to look at the tree.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import trio

from agentd.checkpoints import _Job, _Shadow
from agentd.config import CheckpointsConfig

from ._common import Ctx, Result

FILES = 10_000
CHANGED = 10


def _tree(root: Path, files: int) -> None:
    per = 100
    for d in range(files // per):
        sub = root / f"pkg{d:03d}"
        sub.mkdir(parents=True)
        for f in range(per):
            (sub / f"mod{f:03d}.py").write_text(f"# module {d}/{f}\n" + "x = 1\n" * 20)


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b",
               GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")
    return env


def bench_checkpoints(ctx: Ctx) -> list[Result]:
    files, repeats = (2_000, 5) if ctx.quick else (FILES, 21)
    root = ctx.scratch("checkpoints")
    work, user = root / "work", root / "user"
    _tree(work, files)
    _tree(user, files)
    env = _git_env()
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
        subprocess.run(["git", *args], cwd=user, env=env, check=True, capture_output=True)
    shadow = _Shadow(root / "state" / "checkpoints", str(work), CheckpointsConfig(), root / "state")
    # The same tree recorded with [checkpoints] watch = false: what git alone costs, every time.
    by_git = _Shadow(root / "state-git" / "checkpoints", str(work), CheckpointsConfig(watch=False), root / "state-git")
    unchanged, changed, base_u, base_c, unchanged_git = [], [], [], [], []
    first: list[float] = []

    def status() -> float:
        t0 = time.perf_counter()
        subprocess.run(["git", "status", "--porcelain"], cwd=user, env=env, check=True, capture_output=True)
        return (time.perf_counter() - t0) * 1000

    async def main() -> None:
        async def once(n: int, on: _Shadow = shadow) -> float:
            job = _Job("cbench", f"cbench/r{n}/before")
            t0 = time.perf_counter()
            await on.record(job)
            assert len(job.tree) == 40, job.error
            return (time.perf_counter() - t0) * 1000

        first.append(await once(0))  # cold: hashes every file
        await once(1)
        await once(0, by_git)
        for i in range(repeats):
            unchanged.append(await once(2 + 2 * i))
            unchanged_git.append(await once(2 + 2 * i, by_git))
            base_u.append(await trio.to_thread.run_sync(status))
            for k in range(CHANGED):
                for tree in (work, user):
                    with open(tree / f"pkg{(k * 7 + i) % (files // 100):03d}" / f"mod{k:03d}.py", "a") as f:
                        f.write(f"y = {i}\n")
            changed.append(await once(3 + 2 * i))
            await once(3 + 2 * i, by_git)  # takes the change in, so the next unchanged one is unchanged
            base_c.append(await trio.to_thread.run_sync(status))

    trio.run(main)
    n = f"{files:,}"
    r1 = Result(f"checkpoint: unchanged {n}-file tree", "ms", unchanged, base_u,
                baseline_name="git status of the same tree (its own repository)", higher=False,
                target="<= 100 ms")
    r2 = Result(f"checkpoint: {n}-file tree, {CHANGED} files changed", "ms", changed, base_c,
                baseline_name="git status of the same tree (its own repository)", higher=False,
                target="<= 150 ms")
    r3 = Result(f"checkpoint: unchanged {n}-file tree, [checkpoints] watch = false", "ms", unchanged_git, base_u,
                baseline_name="git status of the same tree (its own repository)", higher=False,
                target="<= 100 ms")
    for r, limit in ((r1, 100), (r2, 150), (r3, 100)):
        r.met = r.median is not None and r.median <= limit
        r.notes.append(f"warm shadow index (the tree recorded before); the first, cold checkpoint took "
                       f"{first[0]:.0f} ms; {repeats} repeats")
    r1.notes.append(f"[checkpoints] watch (the default) saw the tree unchanged, so no git ran; "
                    f"{'armed' if shadow._watch is not None and shadow._watch.armed else 'NOT armed: ' + (shadow._watch.unarmed if shadow._watch else 'no watch')}")
    r3.notes.append("every checkpoint runs git (ls-files, and the ref), as with a tree the watch cannot vouch for")
    for s_ in (shadow, by_git):
        if s_._watch is not None:
            s_._watch.close()
    return [r1, r2, r3]
