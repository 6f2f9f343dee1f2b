"""scripts/eval_recall.py's verdict: recall over what the host compacted, not whether the
host compacted every planted turn (0.22.2 leaves 36 of 78 outside its span, all recalled)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scripts_eval_recall", ROOT / "scripts" / "eval_recall.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _result(compacted: int, outside: int, misses: int = 0) -> SimpleNamespace:
    rows = [{"compacted": True, "hit": i >= misses} for i in range(compacted)]
    rows += [{"compacted": False, "hit": True} for _ in range(outside)]
    return SimpleNamespace(rows=rows)


def test_full_recall_with_turns_outside_the_span_passes() -> None:
    ok, why = _script().verdict(_result(42, 36), 0.98)
    assert ok, why
    assert "36 left outside" in why


def test_a_miss_among_the_compacted_turns_fails() -> None:
    ok, _why = _script().verdict(_result(42, 36, misses=2), 0.98)
    assert not ok


def test_nothing_compacted_fails() -> None:
    ok, why = _script().verdict(_result(0, 78), 0.98)
    assert not ok and "none of the planted turns" in why
