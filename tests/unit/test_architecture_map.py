"""docs/architecture.md's promise → module → test map cannot go stale: every module and test
file it names exists, every row names at least one of each, and every promise of the README's
"What it fixes" list has its row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Promise → module → test"


def _rows() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert HEADING in text
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| README")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows]


def _paths(cell: str) -> list[str]:
    return re.findall(r"`([\w/]+\.py)`", cell)


def _readme_promises() -> list[int]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    fixes = text.split("## What it fixes", 1)[1].split("\n## ", 1)[0]
    return [int(n) for n in re.findall(r"^(\d+)\. ", fixes, flags=re.MULTILINE)]


def test_every_path_the_map_names_exists() -> None:
    rows = _rows()
    assert rows
    missing = []
    for promise, modules, tests in rows:
        assert _paths(modules) and _paths(tests), promise
        missing += [m for m in _paths(modules) if not (ROOT / "hermes_session_guard" / m).is_file()]
        missing += [t for t in _paths(tests) if not (ROOT / "tests" / t).is_file()]
    assert missing == []


def test_each_test_the_map_names_is_a_test_file() -> None:
    for _promise, _modules, tests in _rows():
        for test in _paths(tests):
            assert test.split("/")[0] in ("unit", "integration") and Path(test).name.startswith("test_"), test


def test_every_readme_promise_has_a_row() -> None:
    promises = _readme_promises()
    assert promises == list(range(1, len(promises) + 1)) and len(promises) >= 7
    mapped = [int(m.group(1)) for row in _rows() if (m := re.match(r"(\d+)\. ", row[0]))]
    assert mapped == promises
