"""The seed's "Multi-agent host stability" scenario with real processes: 13 agent
processes cross the compression threshold together, 10 with their own
``HERMES_HOME`` and 3 sharing one (gateway, CLI and cron resuming one
conversation), against one fake LLM whose summaries take a second."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.store import GuardStore

from .conftest import HOST_HAS_IN_PLACE, HOST_NATIVE_MODE, MODE_PARAMS
from .process_fleet import marker_answer, plan_for, run_fleet, seed_homes, seed_tags
from .test_one_compression_per_session import _leftover_locks

OWN_HOMES = 10
SHARED = 3
SUMMARY_LATENCY = 1.0


def _summary_tags(llm: FakeLLMServer, tags: list[str]) -> dict[str, int]:
    counts = dict.fromkeys(tags, 0)
    for req in llm.summary_requests():
        text = json.dumps(req.body, ensure_ascii=False)
        for tag in tags:  # a turn of its seed (Hermes 0.20 elides part of the middle from the request)
            if re.search(rf"(?<![\w-]){re.escape(tag)}-\d+:", text):
                counts[tag] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_thirteen_processes_compress_within_one_window(
    discovered: Any, llm: FakeLLMServer, tmp_path: Path, mode: str
) -> None:
    llm.reset()
    llm.configure(summary_latency=SUMMARY_LATENCY, reply_fn=marker_answer)
    in_place = (mode == "in_place") if HOST_HAS_IN_PLACE else None

    # (home, session id, tag) per process; the last three share one home and one session
    plan = plan_for(tmp_path, OWN_HOMES, SHARED)
    seed_tag = seed_tags(plan)
    seed_homes(plan, llm.base_url, in_place=in_place)
    reports, procs, _ = run_fleet(tmp_path, plan, llm.base_url, in_place=in_place, timeout=100)
    assert all("error" not in r for r in reports), [r.get("traceback") for r in reports if "error" in r]
    assert all(p.returncode == 0 for p in procs)

    # every process crossed the threshold within one 60-second window, with the guard loaded
    crossed = [r["crossed_at"] for r in reports]
    assert max(crossed) - min(crossed) < 60
    assert all(r["guard_loaded"] for r in reports)

    # no agent's id moved, and each got its own answer
    for (_, sid, tag), r in zip(plan, reports, strict=True):
        assert r["session_id_after"] == sid, r
        assert r["env_session_id"] in (None, sid), r
        assert r["final_response"] == f"{tag}-reply: answered", r

    # one summary per conversation: the shared one was compressed once, not three times
    per_seed = _summary_tags(llm, sorted(set(seed_tag.values())))
    assert per_seed == dict.fromkeys(per_seed, 1), per_seed

    for home, sid in sorted({(h, s) for h, s, _ in plan}):
        tags = [tag for h, s, tag in plan if s == sid]
        rows = probe.sessions_table(home / "state.db")
        # exactly one live session per conversation: no forks, no orphans, not ended
        assert [(r["id"], r["parent_session_id"], r["ended_at"]) for r in rows] == [(sid, None, None)]
        live = [str(m["content"]) for m in probe.live_messages(home / "state.db", sid)]
        kept = _snapshot_texts(home / "state.db", sid)
        everything = "\n".join(live + kept)
        markers = [f"{seed_tag[sid]}-{i}:" for i in range(probe.SEED_MESSAGES)]
        lost = [m for m in markers if m not in everything]
        assert lost == [], (sid, lost)
        for tag in tags:  # each process's turn is live exactly once
            assert sum(t.startswith(f"{tag}-next:") for t in live) == 1, (tag, live)
            assert sum(t == f"{tag}-reply: answered" for t in live) == 1, (tag, live)
        # audit: every operation names this home's session only; one compaction per conversation
        ops: dict[str, list[dict[str, Any]]] = {}
        for e in audit.read_events(home / "logs" / "session_guard.jsonl"):
            if e.get("op_id"):
                ops.setdefault(e["op_id"], []).append(e)
        for events in ops.values():
            assert {e["session_id"] for e in events} | {e.get("session_id_after", sid) for e in events} == {sid}
        outcomes = sorted(evs[-1]["event"] for evs in ops.values())
        # the other processes' turns either adopt the compaction (behind it at their own
        # compression) or, waiting for the session's turn, start on the live transcript
        assert outcomes.count("compression.done") == 1, outcomes
        if HOST_NATIVE_MODE:  # a turn that waited on Hermes's turn lease runs on the transcript Hermes reloaded
            assert len(outcomes) <= len(tags), outcomes
        else:
            assert len(outcomes) == len(tags), outcomes
        assert set(outcomes) <= {"compression.done", "compression.adopted", "turn.live_history"}, outcomes
        assert _leftover_locks(home) == []

    # every log line of every process names its own session, in the text and the [session] tag
    for (_, sid, _), r in zip(plan, reports, strict=True):
        for rec in r["records"]:
            named = {t.split("=", 1)[1] for t in rec["message"].split() if t.startswith(("session=", "session_id="))}
            assert named <= {sid, "None"}, rec
            if named - {"None"}:
                assert rec["tag"] == sid, rec


def _snapshot_texts(db_path: Path, sid: str) -> list[str]:
    """Every snapshot of the session, copied or by reference, through the store's one reader."""
    store = GuardStore(db_path)
    try:
        return [str(m.get("content")) for snap in store.list_snapshots(sid)
                for m in store.snapshot_messages(snap.snapshot_id)]
    finally:
        store.close()
