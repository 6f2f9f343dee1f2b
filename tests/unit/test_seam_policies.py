"""Every seam the guard wraps has a declared failure policy, and ADR 0008 records
the decision for it by name, so a new seam cannot arrive without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_session_guard.seams.table import SEAMS

ADR = Path(__file__).resolve().parents[2] / "docs" / "adr" / "0008-failure-policies.md"
WRAPPED = sorted({row.seam for row in SEAMS if row.wrapper is not None})


def _decisions() -> str:
    return ADR.read_text(encoding="utf-8")


@pytest.mark.parametrize("seam", WRAPPED)
def test_each_wrapped_seam_declares_a_policy_the_adr_records(seam: str) -> None:
    policies = {row.failure_policy for row in SEAMS if row.seam == seam and row.wrapper is not None}
    assert policies and policies <= {"open", "closed"}, policies
    assert f"`{seam}`" in _decisions(), f"ADR 0008 records no failure decision for the {seam} seam"
