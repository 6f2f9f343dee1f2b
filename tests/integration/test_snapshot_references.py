"""Snapshots by reference: on hosts that keep the compacted rows themselves (0.18.2-0.19
in place, 0.20+ native mode) the snapshot of a compaction names Hermes's rows instead of
copying them (ADR 0003). It reads back verbatim after further compactions, in a new
process, after ``repair`` and through every reader (``snapshots --show``, ``export``,
recall); when Hermes later deletes or rewrites those rows, ``doctor`` says the snapshot is
gone and every reader says so too, never a silently shorter transcript. Snapshots the guard
copied (earlier releases, earlier guard versions) keep reading the same way."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands.cli import main as cli_main
from hermes_session_guard.maintenance.corruption import diagnose
from hermes_session_guard.maintenance.state_inspection import load_home_state
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.store import SnapshotGone
from hermes_session_guard.summaries.recall_tool import calling_session, handler

from .conftest import HOST_HAS_IN_PLACE, HOST_NATIVE_MODE, HOST_ROW, new_agent

pytestmark = pytest.mark.skipif(
    not HOST_HAS_IN_PLACE or HOST_ROW.behaviour.snapshot == "copy",
    reason="the guard stores a copy here: 0.13-0.17 rotate (Hermes keeps no rows under the session's id), and "
    "0.18's gateway hygiene and /compress delete the archived rows right after an in-place compaction "
    "(test_crash_recovery.py, test_session_id_contract.py)")

SID = "20260901_080000_ref1"
SYSTEM = "You are a test agent."
FACT = "the staging vault token rotates every ninety minutes"


def _seed(db: Any) -> list[dict[str, Any]]:
    messages = probe.seed_messages()
    messages[4] = {"role": "user", "content": f"note this: {FACT}."}
    probe.seed_session(db, SID, messages)
    return messages


def _compress(db: Any, llm: FakeLLMServer, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert agent.session_id == SID and len(out) < len(messages)
    return out


def _query(home: Path, sql: str, *params: Any) -> list[Any]:
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _copied_rows(home: Path) -> int:
    return int(_query(home, "SELECT COUNT(*) FROM session_guard_snapshot_messages")[0][0])


def _texts(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["content"] for m in messages]


def _shown(snapshot_id: str, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    capsys.readouterr()
    assert cli_main(["snapshots", SID, "--show", snapshot_id, "--json"]) == 0
    return _texts(json.loads(capsys.readouterr().out))


def _gone_findings(home: Path) -> list[Any]:
    _, findings = diagnose(load_home_state(home))
    return [f for f in findings if f.signature == "snapshot_gone"]


def test_a_snapshot_references_hermes_rows_and_reads_back_verbatim(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = _seed(db)
    first = _compress(db, llm, messages)
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    assert snap.host_mode == HOST_ROW.behaviour.strategy and snap.message_count == len(messages)
    assert _texts(store.snapshot_messages(snap.snapshot_id)) == _texts(messages)
    assert _copied_rows(home) == 0  # a reference, no second copy
    assert _query(home, "SELECT COUNT(*) FROM session_guard_snapshot_refs")[0][0] == 1

    # a second compaction: the first snapshot still reads back the same, the second holds the first's result
    grown = first + [{"role": r, "content": f"later {r} {i} " + "x" * 14_000} for i in range(20)
                     for r in ("user", "assistant")]
    for m in grown[len(first):]:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])
    _compress(db, llm, grown)
    old, new = store.list_snapshots(SID)
    assert old.snapshot_id == snap.snapshot_id
    assert _texts(store.snapshot_messages(old.snapshot_id)) == _texts(messages)
    assert _texts(store.snapshot_messages(new.snapshot_id)) == _texts(grown)
    assert _copied_rows(home) == 0

    assert _shown(old.snapshot_id, capsys) == _texts(messages)
    assert _gone_findings(home) == []


def test_a_reference_reads_in_a_new_process_and_after_repair_until_a_row_is_rewritten(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = _seed(db)
    _compress(db, llm, messages)
    (snap,) = guard.store_for(home / "state.db").list_snapshots(SID)
    db.close()
    # Hermes's own repair of state.db (FTS rebuild, schema de-duplication) and the guard's
    import hermes_state

    getattr(hermes_state, "repair_state_db_schema", lambda *_a, **_k: None)(home / "state.db", backup=False)
    capsys.readouterr()
    assert cli_main(["repair", "--apply"]) in (0, 1)
    # a restart: a new process, a new SessionDB, a new guard store
    script = (
        "import json, sys\n"
        "from hermes_session_guard.store import GuardStore\n"
        "store = GuardStore(sys.argv[1])\n"
        "print(json.dumps([m['content'] for m in store.snapshot_messages(sys.argv[2])]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(home / "state.db"), snap.snapshot_id],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == _texts(messages)
    assert _shown(snap.snapshot_id, capsys) == _texts(messages)
    assert _gone_findings(home) == []

    # one archived row rewritten in place: the same number of rows, no longer the same transcript
    conn = sqlite3.connect(home / "state.db")
    try:
        conn.execute("UPDATE messages SET content = 'rewritten' WHERE id = (SELECT MIN(id) FROM messages"
                     " WHERE session_id = ? AND active = 0)", (SID,))
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(SnapshotGone, match="changed content"):
        guard.store_for(home / "state.db").snapshot_messages(snap.snapshot_id)
    (gone,) = _gone_findings(home)
    assert snap.snapshot_id in gone.detail


def test_rows_hermes_deletes_later_make_the_snapshot_gone_loudly(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = _seed(db)
    compacted = _compress(db, llm, messages)
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    if HOST_NATIVE_MODE:
        # what a prune of archived rows would do: delete the session's inactive rows
        conn = sqlite3.connect(home / "state.db")
        try:
            conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 0", (SID,))
            conn.commit()
        finally:
            conn.close()
    else:
        # 0.18-0.19: the gateway's /retry and the TUI's edit rewrite the transcript with
        # Hermes's destructive replace_messages, which deletes the archived rows too
        db.replace_messages(SID, compacted[:-1])
        assert _query(home, "SELECT COUNT(*) FROM messages WHERE session_id = ? AND active = 0", SID)[0][0] == 0
    with pytest.raises(SnapshotGone, match=snap.snapshot_id):
        store.snapshot_messages(snap.snapshot_id)
    capsys.readouterr()
    assert cli_main(["snapshots", SID, "--show", snap.snapshot_id]) == 1
    assert "no longer holds" in capsys.readouterr().err
    (gone,) = _gone_findings(home)
    assert gone.session_id == SID and snap.snapshot_id in gone.detail
    out = tmp_path / "export.json"
    assert cli_main(["export", SID, "-o", str(out)]) == 0, capsys.readouterr()
    (exported,) = json.loads(out.read_text(encoding="utf-8"))["session_guard_snapshots"]
    assert exported["messages"] == [] and "no longer holds" in exported["gone"]


def test_copied_and_referenced_snapshots_read_the_same_everywhere(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy as the guard wrote it before (every release before this change, and still on
    0.13-0.17) beside a reference of the same transcript: ``snapshot_messages``, ``--show``,
    ``export`` and recall give the same for both."""
    messages = _seed(db)
    _compress(db, llm, messages)
    store = guard.store_for(home / "state.db")
    (ref,) = store.list_snapshots(SID)
    copy = store.write_snapshot(snapshot_id=f"{SID}.snapshot.copied", session_id=SID, messages=messages,
                                op_id="op-old", host_version="0.19.0", host_mode="host_in_place",
                                created_at=ref.created_at + 1)
    assert _copied_rows(home) == len(messages)
    for snapshot_id in (ref.snapshot_id, copy.snapshot_id):
        assert _texts(store.snapshot_messages(snapshot_id)) == _texts(messages)
        assert _shown(snapshot_id, capsys) == _texts(messages)
        assert store.snapshot_message(snapshot_id, 5)["content"] == messages[4]["content"]
        assert [m["content"] for _, m in store.snapshot_turns(snapshot_id, 5, 6)] == _texts(messages[4:6])
    out = tmp_path / "export.json"
    capsys.readouterr()
    assert cli_main(["export", SID, "-o", str(out)]) == 0, capsys.readouterr()
    exported = {s["snapshot_id"]: s for s in json.loads(out.read_text(encoding="utf-8"))["session_guard_snapshots"]}
    assert _texts(exported[ref.snapshot_id]["messages"]) == _texts(exported[copy.snapshot_id]["messages"]) \
        == _texts(messages)
    with calling_session(SID):
        answer = handler({"query": "staging vault token rotates"})
    assert FACT in answer
    indexed = {r[0] for r in _query(home, "SELECT snapshot_id FROM session_guard_text_indexed")}
    assert {ref.snapshot_id, copy.snapshot_id} <= indexed
