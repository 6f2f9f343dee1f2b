"""The seam table as data: every tested Hermes release has exactly one row per seam,
rows do not overlap, and every behaviour value is one the guard understands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hermes_session_guard import seams
from hermes_session_guard.compression import DETACH_DB, HOST_IN_PLACE, STRATEGIES
from hermes_session_guard.host_adapter import FLUSH_CURSORS
from hermes_session_guard.hostinfo import parse_version

ROOT = Path(__file__).resolve().parents[2]

ALLOWED = {
    "strategy": set(STRATEGIES),
    "flush_cursor": set(FLUSH_CURSORS),
    "transcript_order": {"id", "timestamp"},
    "lock": {"guard", "native"},
    "lock_failure": {"closed", "open"},
    "native_summary_key": {"", "_compressed_summary"},
    "busy_queue": {"single_slot", "fifo", "fifo_demotes_interrupt"},
    "hygiene_session_db": {"absent", "passed"},
}

# What the wheels say, release by release (docs/compatibility.md has the sources).
EXPECTED = {
    "0.13.0": ("run_agent:AIAgent._compress_context", DETACH_DB, "index", "guard"),
    "0.14.0": ("run_agent:AIAgent._compress_context", DETACH_DB, "index", "guard"),
    "0.15.2": ("agent.conversation_compression:compress_context", DETACH_DB, "index", "guard"),
    "0.16.0": ("agent.conversation_compression:compress_context", DETACH_DB, "index", "native"),
    "0.17.0": ("agent.conversation_compression:compress_context", DETACH_DB, "identity", "native"),
    "0.18.2": ("agent.conversation_compression:compress_context", HOST_IN_PLACE, "marker", "native"),
    "0.19.0": ("agent.conversation_compression:compress_context", HOST_IN_PLACE, "marker", "native"),
}


def test_expected_covers_every_tested_release() -> None:
    assert sorted(EXPECTED) == sorted(seams.TESTED_RELEASES)


@pytest.mark.parametrize("release", seams.TESTED_RELEASES)
@pytest.mark.parametrize("seam", seams.seam_names())
def test_each_tested_release_has_exactly_one_row_per_seam(seam: str, release: str) -> None:
    covering = [row for row in seams.rows_for(seam) if row.covers(parse_version(release))]
    assert len(covering) == 1, [r.range_text for r in covering]
    assert seams.select_row(seam, parse_version(release)) is covering[0]
    assert seams.host_in_table(parse_version(release))


@pytest.mark.parametrize("release", sorted(EXPECTED))
def test_compression_row_per_release(release: str) -> None:
    target, strategy, flush_cursor, lock = EXPECTED[release]
    row = seams.select_row("compression", parse_version(release))
    assert row is not None
    assert (row.target, row.behaviour["strategy"], row.behaviour["flush_cursor"], row.behaviour["lock"]) == (
        target, strategy, flush_cursor, lock,
    )


def test_rows_of_one_seam_do_not_overlap() -> None:
    for seam in seams.seam_names():
        rows = sorted(seams.rows_for(seam), key=lambda r: r.since)
        for a, b in zip(rows, rows[1:], strict=False):
            assert a.since < a.until <= b.since, (a.range_text, b.range_text)


GATEWAY_TRANSCRIPT = {"jsonl_and_offset", "offset", "host"}


@pytest.mark.parametrize("release", seams.TESTED_RELEASES)
def test_gateway_transcript_handling_per_release(release: str) -> None:
    """0.13-0.14 keep a JSONL copy and slice at len(history); 0.15-0.17 only slice;
    0.18.2+ re-baselines by itself after an in-place compaction."""
    row = seams.select_row("gateway_turn", parse_version(release))
    assert row is not None and row.behaviour["transcript"] in GATEWAY_TRANSCRIPT
    expected = {"0.13.0": "jsonl_and_offset", "0.14.0": "jsonl_and_offset"}.get(
        release, "host" if parse_version(release) >= (0, 18, 2) else "offset")
    assert row.behaviour["transcript"] == expected


@pytest.mark.parametrize("row", seams.SEAMS, ids=lambda r: f"{r.seam}{r.range_text}")
def test_row_data_is_well_formed(row: seams.SeamRow) -> None:
    if row.wrapper is not None:  # a "not needed" row wraps nothing, so it has no policy either
        assert row.failure_policy in ("open", "closed")
        assert row.params and all(isinstance(p, str) for p in row.params)
    assert row.note
    for name in row.requires:
        module, _, attribute = name.partition(":")
        assert module and attribute, name
    if row.seam == "compression":
        assert set(row.behaviour) == set(ALLOWED), sorted(row.behaviour)
        for key, value in row.behaviour.items():
            assert value in ALLOWED[key], (key, value)


def test_rows_that_lean_on_host_features_declare_them() -> None:
    """A row whose behaviour depends on a host feature names it in ``requires``, so the
    signature check for an unknown release cannot pick a row the host cannot honour."""
    for row in seams.rows_for("compression"):
        if row.behaviour["strategy"] == HOST_IN_PLACE:
            assert "hermes_state:SessionDB.archive_and_compact" in row.requires
        if row.behaviour["lock"] == "native":
            assert "hermes_state:SessionDB.try_acquire_compression_lock" in row.requires


def test_fallback_order_is_newest_first() -> None:
    order = [row.since for row in seams.fallback_rows("compression")]
    assert order == sorted(order, reverse=True)
    assert seams.oldest_supported("compression") == (0, 13, 0)


@pytest.mark.parametrize("version", ["0.12.9", "0.18.1", "0.20.0", "1.0.0"])
def test_releases_outside_the_table(version: str) -> None:
    assert not seams.host_in_table(parse_version(version))
    assert seams.select_row("compression", parse_version(version)) is None


def test_matrix_script_runs_the_tested_releases() -> None:
    spec = importlib.util.spec_from_file_location("matrix_script", ROOT / "scripts" / "matrix.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("matrix_script", module)
    spec.loader.exec_module(module)
    assert tuple(module.ALL_RELEASES) == seams.TESTED_RELEASES
    assert set(module.DEFAULT_RELEASES) <= set(seams.TESTED_RELEASES)
