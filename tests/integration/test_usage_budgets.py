"""Usage and budgets through the real daemon and agentctl.

The script provider's ``usage`` steps (tests/integration/scripts/spend.toml)
report model calls: "spend ..." costs $0.30 as the provider reports it,
"priced" reports tokens of a model without a cost (the daemon prices it from
``[pricing]``), "long" costs $0.30 and then waits until cancelled.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon

SCRIPTS = Path(__file__).parent / "scripts"
SPEND = str(SCRIPTS / "spend.toml")


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def start(root: Path, config: str) -> Daemon:
    root.mkdir()
    return Daemon(root, config).start()


def new(daemon: Daemon, workdir: Path, *extra: str) -> str:
    return one_json(daemon.agentctl("new", "-p", "script", "-m", SPEND, "--cwd", str(workdir), "--json", *extra))["id"]


def show(daemon: Daemon, conv: str) -> dict[str, Any]:
    return one_json(daemon.agentctl("show", conv, "--json"))


def wait_for_state(daemon: Daemon, conv: str, state: str, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = show(daemon, conv)
        if info["record"]["state"] == state:
            return info
        assert time.monotonic() < deadline, f"{conv} stayed {info['record']['state']}, wanted {state}"
        time.sleep(0.05)


def records(daemon: Daemon, conv: str, type_: str) -> list[dict[str, Any]]:
    return [r for r in daemon.journal(conv) if r["type"] == type_]


def test_usage_accumulates_per_conversation_is_journaled_shown_and_survives_a_restart(
    daemon: Daemon, workdir: Path
) -> None:
    conv = new(daemon, workdir)
    for prompt in ("spend a", "spend b"):
        cp = daemon.agentctl("send", conv, prompt, "--follow")
        assert cp.returncode == 0, cp.stderr

    usage = show(daemon, conv)["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cached_tokens"]) == (2000, 400, 800)
    assert usage["cost_usd"] == pytest.approx(0.60)
    assert usage["ai_units"] == 2 and usage["estimated"] is False

    # Each model call is journaled, and each change of the running totals as a `usage` record.
    assert [r["data"]["input"] for r in records(daemon, conv, "tokens")] == [1000, 1000]
    totals = [r["data"] for r in records(daemon, conv, "usage")]
    assert totals[-1]["cost_usd"] == pytest.approx(0.60) and totals[-1]["input_tokens"] == 2000
    assert [t["input_tokens"] for t in totals] == sorted(t["input_tokens"] for t in totals)

    human = daemon.agentctl("show", conv)
    assert "usage:     2,000 input tokens (800 cached), 400 output, $0.6000, 2 AI units" in human.stdout

    daemon.stop()
    daemon.start()
    again = show(daemon, conv)
    assert again["usage"] == usage
    assert again["record"]["usage"] == usage


def test_cost_comes_from_the_pricing_table_when_the_provider_reports_none(tmp_path: Path, workdir: Path) -> None:
    config = '[pricing."priced-model"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\ncached_per_mtok = 0.5\n'
    d = start(tmp_path / "d", config)
    try:
        conv = new(d, workdir)
        assert d.agentctl("send", conv, "priced", "--follow").returncode == 0
        usage = show(d, conv)["usage"]
        # model "priced-model-2025" takes the price of its longest prefix key:
        # 1M fresh input at $1 + 1M cache reads at $0.50 + 1M output at $2
        assert usage["cost_usd"] == pytest.approx(3.5)
        assert usage["estimated"] is True
        assert "~$3.5000 (estimated from [pricing])" in d.agentctl("show", conv).stdout
    finally:
        d.stop()


def test_a_budget_reached_mid_turn_cuts_it_short_pauses_and_refuses_sends_until_raised_and_continued(
    daemon: Daemon, workdir: Path
) -> None:
    conv = new(daemon, workdir, "--max-cost-usd", "0.25")
    assert show(daemon, conv)["record"]["budget"] == {"max_cost_usd": 0.25, "on_reach": "pause"}

    cp = daemon.agentctl("send", conv, "long job", "--follow", "--json")
    assert cp.returncode == 3, cp.stderr  # the turn was cancelled
    result = json.loads(cp.stdout.splitlines()[-1])
    assert (result["state"], result["reason"]) == ("cancelled", "budget")
    assert "reached its budget" in result["error"]

    info = wait_for_state(daemon, conv, "budget_paused")
    assert info["usage"]["cost_usd"] == pytest.approx(0.30)
    turn = [r for r in records(daemon, conv, "turn") if r["data"]["state"] == "cancelled"][-1]
    assert turn["data"]["reason"] == "budget"
    assert [r["data"] for r in records(daemon, conv, "state")][-1] == {"state": "budget_paused", "reason": "budget"}

    refused = daemon.agentctl("send", conv, "free one")
    assert refused.returncode == 1
    assert "limit: conversation" in refused.stderr and f"agentctl budget {conv}" in refused.stderr
    assert "agentctl continue" in refused.stderr

    # Still at the budget: continue is refused; a raise alone does not resume.
    assert "limit" in daemon.agentctl("continue", conv).stderr
    raised = one_json(daemon.agentctl("budget", conv, "--max-cost-usd", "1", "--json"))
    assert raised["budget"] == {"max_cost_usd": 1.0, "on_reach": "pause"}
    assert raised["state"] == "budget_paused"
    change = records(daemon, conv, "budget")[-1]["data"]
    assert change["budget"] == {"max_cost_usd": 1.0} and change.get("source", "command") == "command"
    assert daemon.agentctl("send", conv, "free one").returncode == 1

    resumed = one_json(daemon.agentctl("continue", conv, "--json"))
    assert resumed["state"] == "idle"
    assert [r["data"] for r in records(daemon, conv, "state")][-1] == {"state": "idle", "reason": "continued"}
    ok = daemon.agentctl("send", conv, "free one", "--follow")
    assert ok.returncode == 0, ok.stderr
    assert "Free answer to: free one" in ok.stdout


def test_continue_on_a_conversation_not_paused_is_invalid(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    cp = daemon.agentctl("continue", conv)
    assert cp.returncode == 8
    assert "not paused on its budget" in cp.stderr


def test_on_reach_stop_closes_the_conversation(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir, "--max-cost-usd", "0.25", "--on-reach", "stop")
    cp = daemon.agentctl("send", conv, "long job", "--follow", "--json")
    assert cp.returncode == 3, cp.stderr
    assert json.loads(cp.stdout.splitlines()[-1])["reason"] == "budget"
    wait_for_state(daemon, conv, "closed")
    assert [r["data"] for r in records(daemon, conv, "state")][-1] == {"state": "closed", "reason": "budget"}
    assert "closed" in daemon.agentctl("send", conv, "more").stderr


def test_lowering_the_budget_below_the_spend_pauses_an_idle_conversation(daemon: Daemon, workdir: Path) -> None:
    conv = new(daemon, workdir)
    assert daemon.agentctl("send", conv, "spend once", "--follow").returncode == 0
    rec = one_json(daemon.agentctl("budget", conv, "--max-cost-usd", "0.1", "--json"))
    assert rec["state"] == "budget_paused"
    assert "budget:    $0.3000 of $0.1000, on reach: pause" in daemon.agentctl("show", conv).stdout
    # Removing the budget lets it continue.
    assert one_json(daemon.agentctl("budget", conv, "--none", "--json")).get("budget") is None
    assert one_json(daemon.agentctl("continue", conv, "--json"))["state"] == "idle"


def test_a_provider_default_budget_comes_from_the_config(tmp_path: Path, workdir: Path) -> None:
    d = start(tmp_path / "d", '[budgets.script]\nmax_cost_usd = 0.5\non_reach = "stop"\n')
    try:
        conv = new(d, workdir)
        assert show(d, conv)["record"]["budget"] == {"max_cost_usd": 0.5, "on_reach": "stop"}
        assert records(d, conv, "budget")[0]["data"] == {"budget": {"max_cost_usd": 0.5, "on_reach": "stop"},
                                                           "source": "config"}
        # An explicit budget on `new` wins over the default.
        other = new(d, workdir, "--max-cost-usd", "2")
        assert show(d, other)["record"]["budget"] == {"max_cost_usd": 2.0, "on_reach": "pause"}
    finally:
        d.stop()


def test_budget_options_are_checked_by_agentctl(daemon: Daemon, workdir: Path) -> None:
    cp = daemon.agentctl("new", "-p", "script", "-m", SPEND, "--cwd", str(workdir), "--on-reach", "stop")
    assert cp.returncode == 2 and "--on-reach needs --max-cost-usd" in cp.stderr
    conv = new(daemon, workdir)
    assert daemon.agentctl("budget", conv).returncode == 2
    assert daemon.agentctl("budget", conv, "--max-cost-usd", "-1").returncode == 2
