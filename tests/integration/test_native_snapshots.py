"""Native mode (Hermes 0.20+): the snapshot of a compaction is a reference to the rows
Hermes keeps itself, not a second copy. It reads back verbatim after further
compactions and through ``snapshots --show``; when Hermes later deletes or rewrites
those rows, ``doctor`` says the snapshot is gone and every reader says so too, never
a silently shorter transcript."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands.cli import main as cli_main
from hermes_session_guard.maintenance.corruption import diagnose
from hermes_session_guard.maintenance.state_inspection import load_home_state
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.store import SnapshotGone

from .conftest import HOST_NATIVE_MODE, new_agent

pytestmark = pytest.mark.skipif(not HOST_NATIVE_MODE, reason="snapshots by reference are native mode's (0.20+); "
                                "earlier releases store a copy (test_session_id_contract.py)")

SID = "20260901_080000_nat1ve"
SYSTEM = "You are a test agent."


def _compress(db: Any, llm: FakeLLMServer, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert agent.session_id == SID and len(out) < len(messages)
    return out


def _snapshot_rows(home: Path) -> int:
    conn = sqlite3.connect(home / "state.db")
    try:
        return int(conn.execute("SELECT COUNT(*) FROM session_guard_snapshot_messages").fetchone()[0])
    finally:
        conn.close()


def test_a_snapshot_references_hermes_rows_and_reads_back_verbatim(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    first = _compress(db, llm, messages)
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    assert snap.host_mode == "host_native" and snap.message_count == len(messages)
    assert [m["content"] for m in store.snapshot_messages(snap.snapshot_id)] == [m["content"] for m in messages]
    assert _snapshot_rows(home) == 0  # a reference, no second copy

    # a second compaction: the first snapshot still reads back the same, the second holds the first's result
    grown = first + [{"role": r, "content": f"later {r} {i} " + "x" * 14_000} for i in range(20)
                     for r in ("user", "assistant")]
    for m in grown[len(first):]:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])
    _compress(db, llm, grown)
    old, new = store.list_snapshots(SID)
    assert old.snapshot_id == snap.snapshot_id
    assert [m["content"] for m in store.snapshot_messages(old.snapshot_id)] == [m["content"] for m in messages]
    assert [m["content"] for m in store.snapshot_messages(new.snapshot_id)] == [m["content"] for m in grown]

    capsys.readouterr()  # what Hermes printed while compacting
    assert cli_main(["snapshots", SID, "--show", old.snapshot_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [m["content"] for m in shown] == [m["content"] for m in messages]
    _, findings = diagnose(load_home_state(home))
    assert [f.signature for f in findings if f.signature == "snapshot_gone"] == []


def test_rows_hermes_deletes_later_make_the_snapshot_gone_loudly(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    _compress(db, llm, messages)
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    # what a prune of archived rows does: Hermes deletes its inactive rows of the session
    conn = sqlite3.connect(home / "state.db")
    try:
        conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 0", (SID,))
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(SnapshotGone, match=snap.snapshot_id):
        store.snapshot_messages(snap.snapshot_id)
    capsys.readouterr()
    assert cli_main(["snapshots", SID, "--show", snap.snapshot_id]) == 1
    assert "no longer holds" in capsys.readouterr().err
    _, findings = diagnose(load_home_state(home))
    (gone,) = [f for f in findings if f.signature == "snapshot_gone"]
    assert gone.session_id == SID and snap.snapshot_id in gone.detail
