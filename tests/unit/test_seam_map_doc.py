"""The seam map in docs/compatibility.md is generated from the seam table and stays so
(scripts/gen_seam_map.py): a stale map fails here."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from hermes_session_guard.seams import table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scripts_gen_seam_map", ROOT / "scripts" / "gen_seam_map.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_seam_map_is_the_table_as_it_stands(gen: ModuleType) -> None:
    doc = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    assert doc.count(gen.BEGIN) == 1 and doc.count(gen.END) == 1
    assert gen.updated(doc) == doc, "docs/compatibility.md's seam map is stale: run python scripts/gen_seam_map.py"


def test_the_map_has_every_seam_row_target_and_note(gen: ModuleType) -> None:
    block = gen.render()
    for row in table.SEAMS:
        assert f"#### `{row.seam}`" in block, row.seam
        assert f"| {row.range_text.replace(',', ', ')} | `{row.target}" in block, (row.seam, row.range_text)
        assert gen._cell(row.note) in block, (row.seam, row.note)


def test_a_changed_row_makes_the_map_stale(gen: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert gen.main(["--check"]) == 0
    first = table.SEAMS[0]
    monkeypatch.setattr(table, "SEAMS", (replace(first, note=first.note + " (changed)"), *table.SEAMS[1:]))
    assert gen.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().out
