"""Quota snapshots: Codex's rate-limit windows as quotas, and a usage report carrying one."""

from __future__ import annotations

from agentd import contract as c
from agentd import usage
from agentd.providers.codex._provider import rate_limit_quotas


def test_codex_rate_limit_windows_become_percent_quotas_with_their_reset_time() -> None:
    # The shape of account/rateLimits/updated's rateLimits (Codex 0.171.0), windows filled in.
    raw = {"limitId": "codex", "primary": {"usedPercent": 42.5, "windowDurationMins": 300, "resetsAt": 1800000000},
           "secondary": {"usedPercent": 10, "windowDurationMins": 10080, "resetsAt": None}, "planType": "plus",
           "credits": None}
    assert rate_limit_quotas(raw) == [
        c.Quota(type="primary (300 min window)", used=42.5, entitlement=100, remaining_percent=57.5, unit="percent",
                reset_at="2027-01-15T08:00:00Z", plan="plus"),
        c.Quota(type="secondary (10080 min window)", used=10.0, entitlement=100, remaining_percent=90.0,
                unit="percent", plan="plus"),
    ]
    # What Codex sends when the endpoint reports none (seen offline): no quota at all.
    assert rate_limit_quotas({"limitId": "codex", "primary": None, "secondary": None}) == []
    assert rate_limit_quotas(None) == []


def test_a_usage_report_with_a_quota_snapshot_replaces_the_totals_and_keeps_the_tokens() -> None:
    total = c.Usage(input_tokens=100, output_tokens=10, cost_usd=0.5)
    snap = [c.Quota(type="primary", used=42.5, unit="percent")]
    after = usage.add_report(total, c.Usage(quota=snap))
    assert after == c.Usage(input_tokens=100, output_tokens=10, cost_usd=0.5, quota=snap)
    assert usage.add_report(after, c.Usage(ai_units=1.0)).quota == snap  # kept until the next snapshot
