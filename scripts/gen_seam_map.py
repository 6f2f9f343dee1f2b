"""Write the seam map in docs/compatibility.md from the seam table (hermes_session_guard/seams/table.py).

The map sits between two marker comments; everything outside them is written by hand.
`python scripts/gen_seam_map.py` rewrites it; `--check` exits 1 when it is stale
(tests/unit/test_seam_map_doc.py checks the same in the unit suite). Edit the table's
rows (their `note`s say what a row does there), never the map.
"""

from __future__ import annotations

import argparse
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from hermes_session_guard.seam_behaviour import Effect, SeamKind

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "compatibility.md"
BEGIN = ("<!-- BEGIN seam map: generated from hermes_session_guard/seams/table.py by scripts/gen_seam_map.py; "
         "edit the table, then run the script -->")
END = "<!-- END seam map -->"

# Where each wrapper module's seams are listed (wrapper, or the instance shim's host function).
AREAS = (
    ("hermes_session_guard.seams.compression", "compression, Hermes's lock and commits"),
    ("hermes_session_guard.seams.legacy.in_place_compaction", "compression, Hermes's lock and commits"),
    ("hermes_session_guard.seams.turns", "turn order"),
    ("hermes_session_guard.seams.legacy.turns", "turn order"),
    ("hermes_session_guard.seams.gateway", "gateway and buffering"),
    ("hermes_session_guard.seams.buffering", "gateway and buffering"),
    ("hermes_session_guard.seams.summaries", "summaries, recall, display"),
    ("hermes_session_guard.seams.legacy.search", "search and export"),
    ("hermes_session_guard.seams.export", "search and export"),
    ("hermes_session_guard.host", "instance shims"),
)


def _area(rows: list[Any]) -> str:
    for row in reversed(rows):  # the newest row that patches decides (older ones may name a legacy wrapper)
        made_by = row.wrapper or row.applied_by
        if made_by is not None:
            module = str(made_by.__module__)
            for prefix, title in AREAS:
                if module == prefix or module.startswith(prefix):
                    return title
            return module.rsplit(".", 1)[-1].replace("_", " ")
    return "not patched on any release"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip() or "-"


def _value(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value) or '""'


def _behaviour(row: Any) -> str:
    return ", ".join(f"{key} `{_value(value)}`" for key, value in row.behaviour.set_values().items()) or "-"


def _wrapper(row: Any) -> str:
    if row.wrapper is not None:
        return f"`{row.wrapper.__name__}`"
    if row.applied_by is not None and row.failure_policy:
        return f"`host.{row.applied_by.__name__}` (instance shim)"
    return "not patched"


def _target(row: Any) -> str:
    params = f"({', '.join(row.params)})" if row.params else ""
    return f"`{row.target}{params}`"


def _flags(rows: list[Any]) -> str:
    patched = [row for row in rows if row.patches] or rows
    flags = []
    if any(row.lazy for row in patched):
        flags.append("lazy: patched when Hermes imports its module, which the guard never imports itself")
    if any(row.kind is SeamKind.INSTANCE_SHIM for row in patched):
        flags.append("instance shim: each Hermes object gets its own attribute, removed by `uninstall()`")
    if all(row.effect is Effect.OBSERVE for row in patched):
        flags.append("read-only: may be patched on a release newer than the table")
    return "; ".join(flags)


def render() -> str:
    """The generated block, markers included."""
    from hermes_session_guard.seams.table import COVERED, rows_for, seam_names

    by_area: dict[str, list[str]] = {}
    for name in seam_names():
        rows = rows_for(name)
        by_area.setdefault(_area(rows), []).append(name)
    covered = ", ".join(f"{since} up to {until}" for since, until in COVERED)
    out = [BEGIN, "",
           f"{len(seam_names())} seams in {sum(len(rows_for(n)) for n in seam_names())} rows, covering {covered} "
           "(`>=since,<until`). Per row: the Hermes target (with the parameters its signature must start "
           "with), the guard's wrapper (`not patched`: the row records why that release needs none), "
           "the failure policy (`open`: a guard error hands the call to Hermes untouched with one ERROR "
           "line; `closed`: a guard error refuses the guarded action; ADR 0008), the typed behaviour the "
           "wrapper reads, the other Hermes names the row needs before anything is patched (`requires`), "
           "and what it does there (the row's note).", ""]
    for area, names in by_area.items():
        out += [f"### {area}", ""]
        for name in names:
            rows = rows_for(name)
            out += [f"#### `{name}`", ""]
            flags = _flags(rows)
            if flags:
                out += [flags[0].upper() + flags[1:] + ".", ""]
            out += ["| Hermes | target | wrapper | failure policy | behaviour | requires | what it does |",
                    "|---|---|---|---|---|---|---|"]
            for row in rows:
                requires = ", ".join(f"`{r}`" for r in row.requires) or "-"
                policy = _value(row.failure_policy) if row.patches and row.failure_policy else "-"
                out.append(f"| {row.range_text.replace(',', ', ')} | {_target(row)} | {_wrapper(row)} | {policy} "
                           f"| {_behaviour(row)} | {requires} | {_cell(row.note)} |")
            out.append("")
    out.append(END)
    return "\n".join(out)


def updated(doc: str) -> str:
    """``doc`` with the block between the markers replaced by :func:`render`."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"error: {DOC.relative_to(ROOT)} has no '{BEGIN[:20]}...' / '{END}' markers")
    return doc[:start] + render() + doc[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the map is stale, write nothing")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    new = updated(doc)
    if args.check:
        if new != doc:
            print(f"{DOC.relative_to(ROOT)}: the seam map is stale; run python scripts/gen_seam_map.py")
            return 1
        return 0
    if new != doc:
        DOC.write_text(new, encoding="utf-8")
        print(f"{DOC.relative_to(ROOT)}: seam map rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
