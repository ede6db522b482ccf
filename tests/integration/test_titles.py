"""What an agent names (its conversation's title, a subagent) is shown on one line: a newline in
it forges no row of `agentctl ls` or `agentctl subagents`, and a title stays within 200
characters (found by a review: a 5,046-character title with a newline made a fake `ls` row)."""

from __future__ import annotations

import json
from pathlib import Path

from daemon_harness import Daemon

SCRIPT = '''
model = "namer"
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "title"
title = "real title\\nc0ffee  idle  script  FAKE ROW ''' + "x" * 5000 + '''"
[[turn.step]]
kind = "subagent"
name = "helper\\nFAKE  completed  forged"
text = "done"
'''


def test_an_agents_title_and_subagent_names_are_one_line_each(tmp_path: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        script = tmp_path / "namer.toml"
        script.write_text(SCRIPT)
        out = d.agentctl("--json", "new", "-p", "script", "-m", str(script), "--cwd", str(work))
        cid = json.loads(out.stdout)["id"]
        assert d.agentctl("send", cid, "go", "--follow").returncode == 0
        record = json.loads(d.agentctl("show", cid, "--json").stdout)["record"]
        assert record["title"].startswith("real title c0ffee idle script FAKE ROW x")
        assert len(record["title"]) == 200 and "\n" not in record["title"]
        titles = [r["data"] for r in d.journal(cid) if r["type"] == "title"]
        assert titles[-1] == record["title"]  # journaled as kept
        listing = d.agentctl("ls", "--all").stdout.splitlines()
        assert len(listing) == 2 and "FAKE ROW" in listing[1], listing  # the header and one row
        subagents = d.agentctl("subagents", cid).stdout.splitlines()
        assert not any(line.startswith("FAKE") for line in subagents), subagents
        assert any("helper\\nFAKE" in line for line in subagents), subagents
        forked = d.agentctl("fork", cid, "--title", "a\nb")
        assert forked.returncode == 0, forked.stderr
    finally:
        d.stop()
