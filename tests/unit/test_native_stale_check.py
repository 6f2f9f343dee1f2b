"""Native mode (0.20+): once Hermes holds its compression lease, the guard asks whether the
agent's list predates a compaction committed since its own generation check. Unchanged
live row ids answer that without a second read of the transcript; changed ones read it."""

from __future__ import annotations

from typing import Any

from hermes_session_guard import host
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Behaviour, Strategy
from hermes_session_guard.seams.compression import _Operation

from .test_compression_contract import Agent, Engine, _messages


def _op(runtime: Runtime, db: Any) -> _Operation:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    return _Operation(runtime, Strategy.HOST_NATIVE, agent, "S1", _messages(), lambda: ([], ""), None, None,
                      Behaviour.of(None))


def test_unchanged_live_rows_answer_not_stale_without_reading_the_transcript(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    op.live_ids = [(1, 10)]
    mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    read = mocker.patch.object(host, "live_transcript", side_effect=AssertionError("read again"))
    assert op.stale_under_host_lock() is False
    read.assert_not_called()


def test_changed_live_rows_read_the_transcript_and_find_a_newer_compaction(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    op.live_ids = [(1, 10)]
    mocker.patch.object(host, "live_row_ranges", return_value=[(11, 14)])
    summary = {"role": "user", "content": "[CONTEXT COMPACTION] earlier turns summarised"}
    compacted = [_messages()[0], summary, *_messages()[8:]]
    mocker.patch.object(host, "live_transcript", return_value=compacted)
    mocker.patch("hermes_session_guard.seams.compression.has_summary_block",
                 side_effect=lambda text: bool(text) and text.startswith("[CONTEXT COMPACTION]"))
    assert op.stale_under_host_lock() is True


def test_without_ids_from_the_generation_check_the_transcript_is_read(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    assert op.live_ids is None
    ranges = mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    read = mocker.patch.object(host, "live_transcript", return_value=_messages())
    assert op.stale_under_host_lock() is False
    read.assert_called_once()
    ranges.assert_not_called()
