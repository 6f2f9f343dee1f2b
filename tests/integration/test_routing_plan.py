"""``doctor`` and ``repair`` share one routing plan: on every corrupted fixture (made
by the real host without the guard) the ``routing_not_at_tip`` findings that say
"re-pointed to X" are exactly the entries the repair plan re-points, with the same
target, and no finding proposes re-pointing an entry to the id it already names.
Before, doctor proposed re-pointing entries to the root they already named while
repair moved others doctor never listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_session_guard.maintenance.corruption import diagnose
from hermes_session_guard.maintenance.lineage_repair import plan_repair
from hermes_session_guard.maintenance.state_inspection import load_home_state

from .test_operator_commands import ALL_FIXTURES, materialize


@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=lambda p: p.name)
def test_doctor_reports_exactly_the_routing_repair_changes(tmp_path: Path, fixture: Path) -> None:
    state = load_home_state(materialize(fixture, tmp_path / "home"))
    lineages, findings = diagnose(state)
    routing = [f for f in findings if f.signature == "routing_not_at_tip"]
    reported = sorted((f.extra["where"], f.extra["routing_key"], f.session_id, f.repaired_by)
                      for f in routing if f.repaired_by.startswith("re-pointed to "))
    assert all(f.repaired_by.startswith(("re-pointed to ", "left on ")) for f in routing)
    plan = plan_repair(state, lineages, findings)
    planned = sorted((c.where, c.session_key, c.old, f"re-pointed to {c.new}") for c in plan.routing)
    assert reported == planned
    # nothing reported points where it already points
    assert all(old != target.removeprefix("re-pointed to ") for _, _, old, target in reported)
