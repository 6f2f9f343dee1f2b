"""An engine of its own that shortens the messages it keeps: its new message (no
counterpart in the input) is found by the source the shim recorded on each input
message, never by what a text says; shortened copies are never taken for it."""

from __future__ import annotations

from typing import Any

from hermes_session_guard.host.engines import produced_positions
from hermes_session_guard.selftest.probe import seed_messages
from hermes_session_guard.summaries.tags import SOURCE_KEY, mark_sources, produced_by_source, unmark_sources
from hermes_session_guard.summaries.wire import provider_messages
from tests.engines.edited_kept import CopyTrimmingEngine, InPlaceTrimmingEngine, SummaryFirstEngine


def _run(engine: Any, marked: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    before = [{"role": "system", "content": "You are a test agent."}, *seed_messages(24, chars=2_500)]
    given = list(before)
    records = mark_sources(given) if marked else []
    after = engine.compress(given)
    found = produced_positions(given, after)
    unmark_sources(records, after)
    return before, after, found


def _digest(after: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(after) if str(m["content"]).startswith("DIGEST of")]


def test_shortened_copies_are_kept_turns_and_the_digest_is_found() -> None:
    _before, after, found = _run(CopyTrimmingEngine())
    assert any("[trimmed " in str(m["content"]) for m in after)
    assert found == _digest(after) and len(found) == 1


def test_without_the_records_shortened_copies_tag_nothing() -> None:
    """What the guard did before it recorded sources: safe, the summary stays visible."""
    _before, after, found = _run(CopyTrimmingEngine(), marked=False)
    assert found == []


def test_in_place_edits_and_a_summary_moved_to_the_front_are_found_too() -> None:
    for engine in (InPlaceTrimmingEngine(), SummaryFirstEngine()):
        _before, after, found = _run(engine)
        assert found == _digest(after), type(engine).__name__


def test_kept_messages_rebuilt_without_their_keys_tag_nothing() -> None:
    before = [{"role": "system", "content": "s"}, *seed_messages(12)]
    given = list(before)
    mark_sources(given)
    after = [given[0], {"role": "user", "content": "DIGEST of 8"},
             *({"role": m["role"], "content": m["content"][:10]} for m in given[-3:])]
    assert produced_by_source(given, after) == []


def test_the_records_never_reach_a_provider_and_are_removed() -> None:
    given = seed_messages(4)
    records = mark_sources(given)
    assert all(SOURCE_KEY in m for m in given)
    assert not any(SOURCE_KEY in m for m in provider_messages(given))
    unmark_sources(records)
    assert not any(SOURCE_KEY in m for m in given)
