"""A session whose in-memory messages hold a lone UTF-16 surrogate and a NUL (0.19
can carry such a str in memory, e.g. half an emoji cut by a truncation) compresses
under the guard as it does without it: the compaction stands on the same id, the
snapshot keeps every message verbatim (the very same str), and the recall index
takes it. Before, writing the snapshot raised ``UnicodeEncodeError`` and every
guarded compression of the session failed (48 -> 48) while the host alone compacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.summaries.recall import Recall, recall_text

from .conftest import HOST_NATIVE_MODE, MODES, new_agent

SID = "20260604_080000_5a11a7e0"
SYSTEM = "You are a test agent."
BROKEN = "turn-3: a broken emoji \ud83d and a stray low half \udc80 in one message"
NUL = "turn-4: a NUL \x00 inside"


@pytest.mark.parametrize("mode", MODES)
def test_a_session_with_lone_surrogates_compresses_and_keeps_them(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    seeded = probe.seed_messages()
    messages = [dict(m) for m in seeded]
    messages[3]["content"], messages[4]["content"] = BROKEN, NUL  # in memory, as the host can hold them
    if HOST_NATIVE_MODE:
        # The snapshot names Hermes's own rows (ADR 0002): they hold these messages as Hermes
        # stored them (its writer replaces lone surrogates), and the snapshot must be exactly that.
        probe.seed_session(db, SID, messages)
        original = [m["content"] for m in probe.live_messages(home / "state.db", SID)]
        assert "broken emoji" in original[3] and original[3] != BROKEN
    else:
        probe.seed_session(db, SID, seeded)  # the guard's own copy keeps the in-memory str
        original = [m["content"] for m in messages]
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, seeded)

    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)

    assert len(out) < len(original) and agent.session_id == SID
    outcomes = [e for e in audit.read_events(guard.audit_path)
                if e.get("session_id") == SID and e["event"].startswith("compression.")]
    assert outcomes[-1]["event"] == "compression.done", outcomes[-1]
    store = guard.store_for(home / "state.db")
    (snap,) = store.list_snapshots(SID)
    kept = [m["content"] for m in store.snapshot_messages(snap.snapshot_id)]
    assert kept[: len(original)] == original  # the same str, surrogates and NUL included
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [SID]
    live = [m["content"] for m in probe.live_messages(home / "state.db", SID)]
    assert not any("broken emoji" in str(t) for t in live)  # compacted once, not carried over as new

    assert store.index_missing_snapshots([SID], recall_text) == 1
    found = Recall(store, SID, [SID], 8000).run({"query": "broken emoji stray"})
    assert "broken emoji" in found
