"""Summary-model failures during a guarded compression: the transcript and the id
stay as they were, nothing is snapshotted, and the audit log says why."""

from __future__ import annotations

import inspect
import socket
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST_HAS_IN_PLACE, MODE_PARAMS

SID = "20260528_155201_68dc5996"


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


FAULTS = {
    "http-500": ("status", 500),
    "timeout": ("timeout", 4),
    "empty": ("empty",),
    "non-utf8": ("garbage", 4096),
    "5MB": ("huge", 5_000_000),
    "refused": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_summary_failure_leaves_everything_unchanged(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, mode: str, fault: str
) -> None:
    base_url = llm.base_url
    if fault == "refused":
        base_url = _closed_port_url()
    else:
        llm.configure(fail_all_summaries=FAULTS[fault])
    probe.write_config(home, base_url, extra={"auxiliary": {"compression": {"timeout": 1}}})
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = probe.make_agent(db, base_url, SID)
    if HOST_HAS_IN_PLACE:
        agent.compression_in_place = mode == "in_place"
    probe.mark_flushed(agent, messages)
    before = [m["content"] for m in messages]

    try:
        returned, _ = agent._compress_context(messages, "sys", approx_tokens=150_000)
    except Exception as exc:  # a host that raises must still leave the session intact
        returned = messages
        raised: Exception | None = exc
    else:
        raised = None

    assert agent.session_id == SID
    assert [m["content"] for m in returned] == before
    assert [m["content"] for m in probe.live_messages(home / "state.db", SID)] == before
    rows = probe.sessions_table(home / "state.db")
    assert [r["id"] for r in rows] == [SID] and rows[0]["ended_at"] is None
    assert guard.store_for(home / "state.db").list_snapshots(SID) == []
    events = [e for e in audit.read_events(guard.audit_path) if e.get("session_id") == SID]
    assert events and events[-1]["event"] in ("compression.failed", "compression.skipped"), (events, raised)
    assert events[-1]["reason"]
    # the next compression with a healthy model works (no lock or state left behind)
    if fault != "refused":
        llm.reset()
        agent.context_compressor._summary_failure_cooldown_until = 0.0
        force = {"force": True} if "force" in inspect.signature(agent._compress_context).parameters else {}
        out, _ = agent._compress_context(messages, "sys", approx_tokens=150_000, **force)
        assert len(out) < len(before) and agent.session_id == SID
