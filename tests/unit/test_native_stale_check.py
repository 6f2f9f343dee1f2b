"""Native mode (0.20+): once Hermes holds its compression lease, the guard asks whether the
agent's list predates a compaction committed since its own generation check. Unchanged
live row ids answer that without a second read of the transcript; changed ones read it."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Behaviour, Strategy
from hermes_session_guard.seams.compression import _Operation
from hermes_session_guard.seams.native_compaction import NativeCompaction

from .test_compression_contract import Agent, Engine, _messages


def _op(runtime: Runtime, db: Any) -> _Operation:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    return _Operation(runtime, Strategy.HOST_NATIVE, agent, "S1", _messages(), lambda: ([], ""), None, None,
                      Behaviour.of(None))


def _native(op: _Operation) -> NativeCompaction:
    assert isinstance(op.steps, NativeCompaction)
    return op.steps


def test_unchanged_live_rows_answer_not_stale_without_reading_the_transcript(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    op.live_ids = [(1, 10)]
    mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    read = mocker.patch.object(host, "live_transcript", side_effect=AssertionError("read again"))
    assert _native(op).stale_under_host_lock() is False
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
    mocker.patch("hermes_session_guard.seams.native_compaction.has_summary_block",
                 side_effect=lambda text: bool(text) and text.startswith("[CONTEXT COMPACTION]"))
    assert _native(op).stale_under_host_lock() is True


def test_without_ids_from_the_generation_check_the_transcript_is_read(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    assert op.live_ids is None
    ranges = mocker.patch.object(host, "live_row_ranges", return_value=[(1, 10)])
    read = mocker.patch.object(host, "live_transcript", return_value=_messages())
    assert _native(op).stale_under_host_lock() is False
    read.assert_called_once()
    ranges.assert_not_called()


def _stamped(first: int) -> list[dict[str, Any]]:
    return [{**m, "_row_id": first + i} for i, m in enumerate(_messages()[:3])]


def test_after_hermes_compacted_its_row_ids_on_the_list_answer_without_reading_the_texts(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    op = _op(runtime, db)
    mocker.patch.object(host, "live_row_ranges", return_value=[(5, 7)])
    brief = mocker.patch.object(host, "live_brief", side_effect=AssertionError("texts read"))
    assert _native(op).kept_and_lost(_stamped(5), []) == ([], [])
    brief.assert_not_called()


@pytest.mark.parametrize("case", ["another live row", "a message without a row id", "a duplicated id", "foreign"])
def test_anything_the_row_ids_do_not_settle_reads_the_live_rows(
    runtime: Runtime, db: Any, mocker: Any, case: str
) -> None:
    op = _op(runtime, db)
    compressed, foreign = _stamped(5), []
    arrived = {"role": "user", "content": "stored by another writer meanwhile", "tool_call_id": None}
    live = [{k: v for k, v in m.items() if k != "_row_id"} for m in compressed]
    runs = [(5, 7)]
    if case == "another live row":
        runs, live = [(5, 8)], [*live, arrived]
    elif case == "a message without a row id":
        del compressed[1]["_row_id"]
    elif case == "a duplicated id":
        compressed[2]["_row_id"] = 6
    else:
        foreign = [arrived]
        runs, live = [(5, 8)], [*live, arrived]
    mocker.patch.object(host, "live_row_ranges", return_value=runs)
    brief = mocker.patch.object(host, "live_brief", return_value=live)
    mocker.patch.object(host, "live_transcript", return_value=live)
    kept, lost = _native(op).kept_and_lost(compressed, foreign)
    brief.assert_called_once()
    assert kept == ([arrived] if case in ("another live row", "foreign") else [])
    assert lost == []
