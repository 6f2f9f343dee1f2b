"""The row a behaviour seam gets on a release outside the table follows from what Hermes has
(seams/capabilities.py): for the capabilities of every tested release, the derived behaviour is
the table's row for that release (the host test checks the same against the real releases)."""

from __future__ import annotations

import pytest

from hermes_session_guard.hostinfo import parse_version
from hermes_session_guard.seam_behaviour import LockMode, SnapshotStorage, Strategy
from hermes_session_guard.seams import capabilities as caps_mod
from hermes_session_guard.seams.capabilities import Capabilities, choose_rows, derive
from hermes_session_guard.seams.table import fallback_rows, select_row

_DETACHED: dict[str, bool] = {}
_NATIVE_LOCK = dict(_DETACHED, native_lock=True)
_IN_PLACE = dict(_NATIVE_LOCK, in_place=True, identity_flush_ids=True)
_NATIVE = dict(_IN_PLACE, resume_reads_archive_apart=True, holder_checked_commit=True, turn_leases=True)

# what each release has (read off its wheel: the host test test_capabilities_match_table.py)
PROFILES: dict[str, Capabilities] = {
    "0.14.0": Capabilities(jsonl_transcript=True),
    "0.15.2": Capabilities(**_DETACHED),
    "0.16.0": Capabilities(**_NATIVE_LOCK),
    "0.17.0": Capabilities(**_NATIVE_LOCK, identity_flush_ids=True, timestamp_order=True),
    "0.18.2": Capabilities(**_IN_PLACE),
    "0.19.0": Capabilities(**_IN_PLACE, resume_reads_archive_apart=True),
    "0.20.1": Capabilities(**_NATIVE),
    "0.22.2": Capabilities(**_NATIVE),
}


@pytest.mark.parametrize("version", sorted(PROFILES))
@pytest.mark.parametrize("seam", ["compression", "gateway_turn", "transcript_load", "api_chat_completions_turns",
                                  "api_responses_turns"])
def test_the_derived_behaviour_is_the_table_s_row_for_that_release(version: str, seam: str) -> None:
    row = select_row(seam, parse_version(version))
    assert row is not None
    caps = PROFILES[version]
    assert caps_mod.matches(row, derive(seam, caps)), (row.behaviour, derive(seam, caps))
    assert row in choose_rows(seam, list(fallback_rows(seam)), caps)


def test_strategy_follows_what_hermes_does_itself() -> None:
    native = derive("compression", PROFILES["0.22.2"])
    assert (native["strategy"], native["lock"], native["snapshot"]) == (
        Strategy.HOST_NATIVE, LockMode.HOST, SnapshotStorage.REFERENCE)
    # the same Hermes without a holder-checked commit: the guard holds Hermes's lock around its in-place compaction
    unchecked = Capabilities(**{**_NATIVE, "holder_checked_commit": False})
    assert derive("compression", unchecked)["strategy"] is Strategy.HOST_IN_PLACE
    assert derive("compression", unchecked)["lock"] is LockMode.NATIVE
    # no in-place compaction at all: every rotation step needs the SessionDB, so detach it
    assert derive("compression", Capabilities(**_NATIVE_LOCK, turn_leases=True))["strategy"] is Strategy.DETACH_DB
    assert derive("compression", Capabilities())["lock"] is LockMode.GUARD


def test_no_row_is_chosen_when_no_tested_row_has_the_behaviour_called_for() -> None:
    odd = Capabilities(in_place=True)  # in place without any lock: no tested release was like that
    assert choose_rows("compression", list(fallback_rows("compression")), odd) == []


def test_newer_rows_come_first_among_equal_behaviour() -> None:
    rows = choose_rows("compression", list(fallback_rows("compression")), PROFILES["0.14.0"])
    assert [r.range_text for r in rows] == [">=0.15.0,<0.16.0", ">=0.13.0,<0.15.0"]
