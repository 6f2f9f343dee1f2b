"""The seam table as data: every tested Hermes release has exactly one row per seam,
rows do not overlap, and every behaviour value is one the guard understands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hermes_session_guard.hostinfo import parse_version
from hermes_session_guard.seam_behaviour import FlushCursor, Strategy
from hermes_session_guard.seams import table as seams

ROOT = Path(__file__).resolve().parents[2]

ALLOWED = {
    "strategy": set(Strategy),
    "flush_cursor": set(FlushCursor),
    "transcript_order": {"id", "timestamp"},
    "lock": {"guard", "native", "host"},
    "lock_failure": {"closed", "open"},
    "native_summary_key": {"", "_compressed_summary"},
    "snapshot": {"copy", "reference"},
}

# What the wheels say, release by release (docs/compatibility.md has the sources).
EXPECTED = {
    "0.13.0": ("run_agent:AIAgent._compress_context", Strategy.DETACH_DB, "index", "guard"),
    "0.14.0": ("run_agent:AIAgent._compress_context", Strategy.DETACH_DB, "index", "guard"),
    "0.15.0": ("agent.conversation_compression:compress_context", Strategy.DETACH_DB, "index", "guard"),
    "0.15.1": ("agent.conversation_compression:compress_context", Strategy.DETACH_DB, "index", "guard"),
    "0.15.2": ("agent.conversation_compression:compress_context", Strategy.DETACH_DB, "index", "guard"),
    "0.16.0": ("agent.conversation_compression:compress_context", Strategy.DETACH_DB, "index", "native"),
    "0.17.0": ("agent.conversation_compression:compress_context", Strategy.DETACH_DB, "identity", "native"),
    "0.18.0": ("agent.conversation_compression:compress_context", Strategy.HOST_IN_PLACE, "marker", "native"),
    "0.18.1": ("agent.conversation_compression:compress_context", Strategy.HOST_IN_PLACE, "marker", "native"),
    "0.18.2": ("agent.conversation_compression:compress_context", Strategy.HOST_IN_PLACE, "marker", "native"),
    "0.19.0": ("agent.conversation_compression:compress_context", Strategy.HOST_IN_PLACE, "marker", "native"),
    "0.20.1": ("agent.conversation_compression:compress_context", Strategy.HOST_NATIVE, "marker", "host"),
    "0.22.2": ("agent.conversation_compression:compress_context", Strategy.HOST_NATIVE, "marker", "host"),
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
    assert (row.target, row.behaviour.strategy, row.behaviour.flush_cursor, row.behaviour.lock) == (
        target, strategy, flush_cursor, lock,
    )


@pytest.mark.parametrize("release", [*seams.TESTED_RELEASES, "newest rows"])
def test_one_wrapper_per_hermes_target(release: str) -> None:
    """No two seams wrap one Hermes function on any release (apply.py never stacks two
    layers of the guard; a second one is refused): what a target needs is one wrapper."""
    if release == "newest rows":  # a release past the table: each seam's newest row
        rows = [seams.fallback_rows(seam)[0] for seam in seams.seam_names() if seams.fallback_rows(seam)]
    else:
        rows = [row for seam in seams.seam_names() if (row := seams.select_row(seam, parse_version(release)))]
    targets = [row.target for row in rows if row.patches and row.wrapper is not None]
    assert len(targets) == len(set(targets)), sorted(t for t in targets if targets.count(t) > 1)


def test_rows_of_one_seam_do_not_overlap() -> None:
    for seam in seams.seam_names():
        rows = sorted(seams.rows_for(seam), key=lambda r: r.since)
        for a, b in zip(rows, rows[1:], strict=False):
            assert a.since < a.until <= b.since, (a.range_text, b.range_text)


GATEWAY_TRANSCRIPT = {"jsonl_and_offset", "offset", "host"}


@pytest.mark.parametrize("release", seams.TESTED_RELEASES)
def test_gateway_transcript_handling_per_release(release: str) -> None:
    """0.13-0.14 keep a JSONL copy and slice at len(history); 0.15-0.17 only slice;
    0.18+ re-baseline by themselves after an in-place compaction."""
    row = seams.select_row("gateway_turn", parse_version(release))
    assert row is not None and row.behaviour.transcript in GATEWAY_TRANSCRIPT
    expected = {"0.13.0": "jsonl_and_offset", "0.14.0": "jsonl_and_offset"}.get(
        release, "host" if parse_version(release) >= (0, 18, 0) else "offset")
    assert row.behaviour.transcript == expected


@pytest.mark.parametrize("row", seams.SEAMS, ids=lambda r: f"{r.seam}{r.range_text}")
def test_row_data_is_well_formed(row: seams.SeamRow) -> None:
    if row.wrapper is not None:  # a "not needed" row wraps nothing, so it has no policy either
        assert row.failure_policy in ("open", "closed")
        # its leading parameters; none only for a target that takes none (checked like any signature)
        assert row.params or row.seam == "toolset_keys", row.seam
        assert all(isinstance(p, str) for p in row.params)
    assert row.note
    for name in row.requires:
        module, _, attribute = name.partition(":")
        assert module and attribute, name
    if row.seam == "compression":
        assert set(row.behaviour.set_values()) == set(ALLOWED), sorted(row.behaviour.set_values())
        for key, value in row.behaviour.set_values().items():
            assert value in ALLOWED[key], (key, value)


def test_rows_that_lean_on_host_features_declare_them() -> None:
    """A row whose behaviour depends on a host feature names it in ``requires``, so the
    signature check for an unknown release cannot pick a row the host cannot honour."""
    for row in seams.rows_for("compression"):
        if row.behaviour.strategy in (Strategy.HOST_IN_PLACE, Strategy.HOST_NATIVE):
            assert "hermes_state:SessionDB.archive_and_compact" in row.requires
        if row.behaviour.strategy == Strategy.HOST_NATIVE:
            assert "hermes_state:SessionDB.acquire_session_turn_lease" in row.requires
        if row.behaviour.lock in ("native", "host"):
            assert "hermes_state:SessionDB.try_acquire_compression_lock" in row.requires


def test_fallback_order_is_newest_first() -> None:
    order = [row.since for row in seams.fallback_rows("compression")]
    assert order == sorted(order, reverse=True)
    assert seams.oldest_supported("compression") == (0, 13, 0)


@pytest.mark.parametrize("version", ["0.12.9", "0.23.0", "1.0.0"])
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


# The builder the table is written with.


def test_a_seam_entry_expands_to_one_row_per_range_clipped_to_the_covered_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(seams, "COVERED", (("0.13.0", "0.18.0"), ("0.18.2", "0.20.0")))  # a table with a gap
    rows = seams.seam("demo", module="m", attribute="A.f", params=("self",), wrapper=seams.compression_wrapper,
                      behaviour={"native_summary_key": "1", "lease_table": "1"}, note="shared",
                      ranges={"0.17.0+": {"behaviour": {"lease_table": "2"}}, "0.13.0-0.15.0": {"attribute": "A.g"}})
    assert [(r.since, r.until) for r in rows] == [((0, 13, 0), (0, 15, 0)), ((0, 17, 0), (0, 18, 0)),
                                                  ((0, 18, 2), (0, 20, 0))]
    assert [r.target for r in rows] == ["m:A.g", "m:A.f", "m:A.f"]
    assert [r.behaviour.set_values() for r in rows] == [{"native_summary_key": "1", "lease_table": "1"},
                                           {"native_summary_key": "1", "lease_table": "2"},
                                           {"native_summary_key": "1", "lease_table": "2"}]
    assert {r.note for r in rows} == {"shared"} and {r.seam for r in rows} == {"demo"}
    assert not any(r.covers((0, 18, 1)) for r in rows)  # a gap between spans stays uncovered


def test_a_not_needed_range_wraps_nothing_and_says_why() -> None:
    (row,) = seams.seam("demo", module="m", attribute="f", params=("a",), wrapper=seams.compression_wrapper,
                        ranges={"0.13.0-0.14.0": seams.not_needed("no such feature")})
    assert (row.wrapper, row.params, row.failure_policy) == (None, (), "")
    assert row.note == "not needed: no such feature"


@pytest.mark.parametrize("text", ["0.15.0", "0.16.0-0.15.0", "0.15.0-0.15.0"])
def test_a_malformed_range_fails_at_import_time(text: str) -> None:
    with pytest.raises(ValueError, match="seam range"):
        seams.seam("demo", module="m", attribute="f", ranges={text: {}})


def test_an_unknown_row_field_fails_at_import_time() -> None:
    with pytest.raises(TypeError):
        seams.seam("demo", module="m", attribute="f", ranges={"0.13.0+": {"atribute": "g"}})


def test_a_new_release_is_a_table_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving the end of COVERED extends every open range ("since+") to the new release;
    a seam that changes there gets one more range."""
    monkeypatch.setattr(seams, "COVERED", (("0.13.0", "0.18.0"), ("0.18.2", "0.21.0")))
    unchanged = seams.seam("demo", module="m", attribute="f", ranges={"0.13.0+": {}})
    assert unchanged[-1].covers((0, 20, 0)) and not unchanged[-1].covers((0, 21, 0))
    changed = seams.seam("demo", module="m", attribute="f", behaviour={"lease_table": "old"},
                         ranges={"0.13.0-0.20.0": {}, "0.20.0+": {"behaviour": {"lease_table": "new"}}})
    assert [(r.range_text, r.behaviour.lease_table) for r in changed] == [
        (">=0.13.0,<0.18.0", "old"), (">=0.18.2,<0.20.0", "old"), (">=0.20.0,<0.21.0", "new")]


def test_every_tested_release_is_covered_and_covered_ends_at_the_table() -> None:
    for release in seams.TESTED_RELEASES:
        assert any(parse_version(a) <= parse_version(release) < parse_version(b) for a, b in seams.COVERED)
    assert max(row.until for row in seams.SEAMS) == parse_version(seams.COVERED[-1][1])


def test_releases_past_the_index_are_repackagings_in_native_mode() -> None:
    """The releases after 0.19.0 come from repackagings (scripts/matrix.py RELEASE_PACKAGES);
    on every one of them the compression row is native mode."""
    for release in seams.TESTED_RELEASES:
        row = seams.select_row("compression", parse_version(release))
        assert row is not None
        assert (row.behaviour.strategy == Strategy.HOST_NATIVE) == (parse_version(release) >= (0, 20, 0))


@pytest.mark.parametrize("seam", seams.seam_names())
@pytest.mark.parametrize(("release", "same_as"), [("0.15.0", "0.15.2"), ("0.15.1", "0.15.2"),
                                                  ("0.18.0", "0.18.2"), ("0.18.1", "0.18.2")])
def test_point_releases_share_their_neighbours_rows(seam: str, release: str, same_as: str) -> None:
    """0.15.0/0.15.1 have 0.15.2's seam targets and behaviour, 0.18.0/0.18.1 have 0.18.2's
    (in-place compaction, native lock with refresh, ``_db_persisted`` flush, demoting busy queue)."""
    assert seams.select_row(seam, parse_version(release)) is seams.select_row(seam, parse_version(same_as))
