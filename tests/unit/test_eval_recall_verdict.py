"""The recall eval's verdict (``selftest.recall_eval.verdict``, used by scripts/eval_recall.py
and the host test): recall over what the host compacted, not whether the host compacted every
planted turn (0.22.2 leaves 36 of 78 outside its span, all recalled)."""

from __future__ import annotations

from hermes_session_guard.selftest.recall_eval import EvalResult, verdict


def _result(compacted: int, outside: int, misses: int = 0) -> EvalResult:
    rows = [{"compacted": True, "hit": i >= misses} for i in range(compacted)]
    rows += [{"compacted": False, "hit": True} for _ in range(outside)]
    return EvalResult(host_version=None, compacted=(1, compacted) if compacted else None, rows=rows)


def test_full_recall_with_turns_outside_the_span_passes() -> None:
    ok, why = verdict(_result(42, 36), 0.98)
    assert ok, why
    assert "36 left outside" in why


def test_every_planted_turn_compacted_and_recalled_passes() -> None:
    ok, why = verdict(_result(78, 0))
    assert ok and "outside" not in why


def test_a_miss_among_the_compacted_turns_fails() -> None:
    ok, _why = verdict(_result(42, 36, misses=2), 0.98)
    assert not ok


def test_nothing_compacted_fails() -> None:
    ok, why = verdict(_result(0, 78), 0.98)
    assert not ok and "none of the planted turns" in why


def test_nothing_planted_fails() -> None:
    assert verdict(_result(0, 0)) == (False, "nothing planted")
