"""ADR 0008 and the seam table say the same about failure policies: every seam the table
patches has a declared policy, ADR 0008's per-seam list names exactly those seams with
that policy, and every row of its decision table that names a seam and states a policy in
bold states that seam's policy. A new seam cannot arrive without a decision, and a policy
changed on one side only fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_session_guard.seam_behaviour import FailurePolicy
from hermes_session_guard.seams.table import SEAMS

ADR = Path(__file__).resolve().parents[2] / "docs" / "adr" / "0008-failure-policies.md"
PATCHED = sorted({row.seam for row in SEAMS if row.patches})
POLICY_WORDS = {"open": FailurePolicy.OPEN, "closed": FailurePolicy.CLOSED}


def _table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first markdown table under ``## <section>``."""
    text = ADR.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"ADR 0008 has no table under '## {section}'"
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in rows[2:]]


def _per_seam() -> dict[str, str]:
    listed: dict[str, str] = {}
    for cells in _table_rows("The policy of each seam"):
        name = cells[0].strip("`")
        assert name not in listed, f"ADR 0008 lists seam {name} twice"
        listed[name] = cells[1]
    return listed


def _decided() -> list[tuple[set[str], str]]:
    """(seams named in the 'when' cell, the bold policy word opening the behaviour cell) for
    each decision row that states one."""
    names = {row.seam for row in SEAMS}
    decided = []
    for cells in _table_rows("Open or closed, per seam"):
        word = re.match(r"\*\*(\w+)\*\*", cells[1])
        seams = {n for n in re.findall(r"`([a-z_]+)`", cells[0]) if n in names}
        if word and word.group(1) in POLICY_WORDS and seams:
            decided.append((seams, word.group(1)))
    return decided


def _policy(seam: str) -> FailurePolicy:
    policies = {row.failure_policy for row in SEAMS if row.seam == seam and row.patches}
    assert len(policies) == 1, f"seam {seam}'s rows disagree on their failure policy: {policies}"
    return policies.pop()


@pytest.mark.parametrize("seam", PATCHED)
def test_each_patched_seam_declares_a_policy_the_adr_lists(seam: str) -> None:
    policy = _policy(seam)
    assert policy in (FailurePolicy.OPEN, FailurePolicy.CLOSED), policy
    listed = _per_seam()
    assert seam in listed, f"ADR 0008's per-seam list has no {seam}"
    assert POLICY_WORDS.get(listed[seam]) is policy, f"ADR 0008 lists {seam} as {listed[seam]}, the table {policy}"


def test_every_seam_the_adr_lists_is_in_the_table() -> None:
    assert sorted(_per_seam()) == PATCHED


def test_every_decision_row_naming_a_seam_states_its_policy() -> None:
    decided = _decided()
    assert {"compression", "wire", "busy_message", "turn_order"} <= set().union(*(s for s, _ in decided))
    for seams, word in decided:
        for seam in seams:
            policy = _policy(seam)
            assert POLICY_WORDS[word] is policy, f"ADR 0008 decides {seam} {word}; the table says {policy}"


def test_a_disagreeing_policy_would_be_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the compression seam read as open disagrees with the ADR's rows."""
    real = _policy
    monkeypatch.setitem(globals(), "_policy", lambda seam: FailurePolicy.OPEN if seam == "compression" else real(seam))
    with pytest.raises(AssertionError, match="compression"):
        test_every_decision_row_naming_a_seam_states_its_policy()
