"""One commit writes one row set: a compaction that stands records its summary marks, its
generation and its outcome through one store call (``GuardStore.record_compaction``), in
one transaction: all three rows, or (one of them failing) none."""

from __future__ import annotations

import ast
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.config import GuardConfig, LockConfig
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression
from hermes_session_guard.store import CompactionRows, CompressionEnd, CompressionStart, GuardStore

from .test_compression_contract import Agent, Engine

PACKAGE = Path(hermes_session_guard.__file__).parent


def _rows(op_id: str, snapshot_id: str = "s1.snapshot.1", *, begun: bool = True) -> CompactionRows:
    start = None if begun else CompressionStart(op_id, "s1", 10, holder="pid=1", strategy="detach_db",
                                                  started_at=1.0)
    end = CompressionEnd(op_id, "done", snapshot_id=snapshot_id, messages_after=3, summary_chars=42,
                         steps={"summary_finished_at": 2.0}, start=start)
    return CompactionRows("s1", snapshot_id, 1.5, ((0, "h1", 1, 7),), 1, "digest", end)


def _table_rows(store: GuardStore) -> tuple[Any, Any, Any]:
    summaries = store.read_all("SELECT session_id, content_hash, snapshot_id, first_turn, last_turn"
                               " FROM session_guard_summaries")
    generations = store.read_all("SELECT session_id, generation, op_id, snapshot_id FROM session_guard_generations")
    compressions = store.read_all("SELECT op_id, phase, snapshot_id, messages_after, summary_chars,"
                                  " summary_finished_at, finished_at IS NOT NULL FROM session_guard_compressions")
    return summaries, generations, compressions


def test_one_call_writes_the_summaries_the_generation_and_the_outcome(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    try:
        record = store.record_compaction(_rows("op1", begun=False))
        assert (record.generation, record.op_id, record.snapshot_id) == (1, "op1", "s1.snapshot.1")
        assert _table_rows(store) == (
            [("s1", "h1", "s1.snapshot.1", 1, 7)],
            [("s1", 1, "op1", "s1.snapshot.1")],
            [("op1", "done", "s1.snapshot.1", 3, 42, 2.0, 1)],
        )
    finally:
        store.close()


def test_a_failing_row_leaves_none_of_the_set(tmp_path: Path) -> None:
    """The phase row is written last: a database that refuses it leaves no summary mark and
    no generation of that compaction either."""
    store = GuardStore(tmp_path / "state.db")
    try:
        store.begin_compression("op1", "s1", 10)
        with store.transaction() as conn:
            conn.execute("CREATE TEMP TRIGGER refuse BEFORE UPDATE ON session_guard_compressions"
                         " BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            store.record_compaction(_rows("op1"))
        summaries, generations, compressions = _table_rows(store)
        assert summaries == [] and generations == []
        assert [(op, phase) for op, phase, *_ in compressions] == [("op1", "started")]
    finally:
        store.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    rt = Runtime(config=replace(GuardConfig(), lock=LockConfig(wait_seconds=0.05)), host_version="test",
                 fixed_home=tmp_path)
    yield rt
    rt.close()


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_a_compaction_records_its_rows_with_one_call(
    runtime: Runtime, db: Any, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[CompactionRows] = []
    record = GuardStore.record_compaction

    def spy(self: GuardStore, rows: CompactionRows) -> Any:
        calls.append(rows)
        return record(self, rows)

    monkeypatch.setattr(GuardStore, "record_compaction", spy)
    agent = Agent(db, Engine())
    agent.rotate_on_compress = strategy == Strategy.DETACH_DB
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(10)]
    out, _ = guarded_compression(runtime, strategy, agent, messages, lambda: agent._compress_context(messages, "s"))
    (rows,) = calls
    summaries, generations, compressions = _table_rows(runtime.store_for(db.db_path))
    assert [s[2] for s in summaries] == [rows.snapshot_id] and rows.snapshot_id is not None
    assert generations == [("S1", 1, rows.end.op_id, rows.snapshot_id)]
    assert [(c[0], c[1], c[3]) for c in compressions] == [(rows.end.op_id, "done", len(out))]


def test_only_the_store_writes_a_compactions_rows_one_by_one() -> None:
    """Outside ``store/``, no module writes a summary mark or a generation on its own: they
    go through ``record_compaction`` with the outcome, one row set per commit."""
    one_by_one = {"record_summaries", "record_generation"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in one_by_one:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.attr}")
    assert found == []
