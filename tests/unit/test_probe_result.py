"""The live probe's result: pass, fail and skip, and the ordered check table."""

from __future__ import annotations

from hermes_session_guard.selftest.probe import PROBE_CHECKS, ProbeResult


def test_one_failed_check_fails_the_probe() -> None:
    result = ProbeResult()
    assert not result.ok  # nothing passed
    result.check("id", True)
    assert result.ok
    result.check("other", False, "why")
    assert not result.ok
    assert [c["state"] for c in result.as_dict()["checks"]] == ["pass", "fail"]


def test_the_probe_checks_the_contract_in_order() -> None:
    names = [c.name for c in PROBE_CHECKS]
    assert names[0] == "id stable across compression"
    assert {"snapshot", "audit", "lock", "doctor"} <= set(names)
    assert all(callable(c.verify) for c in PROBE_CHECKS)
