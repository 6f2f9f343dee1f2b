"""``status`` figures checked against sessions driven through the real host: two done
compressions and a failed one (the fake LLM failing the summary) on one session, and
a gateway session holding a buffered message and the compression lock mid-compression."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.commands import cli
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.maintenance.session_pressure import p95
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.gateway import start_gateway
from hermes_session_guard.store.snapshots import read_snapshot_references

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST_NATIVE_MODE, new_agent

SID = "20260528_093510_66bfaec7"


def _status(argv: list[str], home: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    os.environ["HERMES_HOME"] = str(home)
    capsys.readouterr()
    code = cli.main(["status", *argv])
    out = capsys.readouterr().out
    if "--json" not in argv:
        return code, out
    # The gateway's agent runs in this process and may print its own status line
    # ("Compacting context ...") into the same stdout: the report is the JSON object.
    start = re.search(r"^\{", out, re.M)
    assert start, out
    return code, json.JSONDecoder().raw_decode(out, start.start())[0]


def _compress(agent: Any, messages: list[Any]) -> list[Any]:
    force = {"force": True} if "force" in inspect.signature(agent._compress_context).parameters else {}
    out, _ = agent._compress_context(messages, "sys", approx_tokens=150_000, **force)
    return out


def test_status_counts_durations_pressure_of_a_session_driven_through_the_host(
    guard: Any, db: Any, llm: ScriptedLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.model_metadata import estimate_messages_tokens_rough

    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    current = _compress(agent, messages)  # 1: done
    more = probe.seed_messages(40, tag="more")
    for m in more:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])
    current = [*current, *more]
    probe.mark_flushed(agent, current)
    llm.configure(fail_all_summaries=("status", 500))  # 2: the summary model fails
    _compress(agent, current)
    llm.reset()
    agent.context_compressor._summary_failure_cooldown_until = 0.0
    current = _compress(agent, current)  # 3: done
    assert agent.session_id == SID

    events = [e for e in audit.read_events(guard.audit_path) if e.get("session_id") == SID]
    outcomes = [e["event"] for e in events if e["event"] != "compression.started"
                and e["event"].startswith("compression.")]
    assert outcomes == ["compression.done", "compression.failed", "compression.done"], outcomes
    durations = [e["duration_ms"] for e in events if e["event"] == "compression.done"]
    (failed,) = [e for e in events if e["event"] == "compression.failed"]

    code, report = _status(["--json", "--session", SID], home, capsys)
    assert code == 0
    (s,) = report["sessions"]
    assert s["compressions"] == {"done": 2, "skipped": 0, "failed": 1}
    h = s["compression_history"]
    assert h["causes"] == {"failed": {failed["reason"]: 1}}
    assert h["last_duration_ms"] == durations[-1] and h["p95_duration_ms"] == p95(durations) == max(durations)
    live = probe.live_messages(home / "state.db", SID)
    assert s["live_messages"] == len(live) == len(current)
    assert s["estimated_tokens"] == estimate_messages_tokens_rough(
        [{"role": r["role"], "content": r["content"] or ""} for r in live])
    # the thresholds are the real agent's: its compressor's threshold, the gateway's 85 %
    t = report["thresholds"]
    assert t["context_length"] == agent.context_compressor.context_length
    assert t["agent_tokens"] == agent.context_compressor.threshold_tokens
    assert t["hygiene_tokens"] == int(agent.context_compressor.context_length * 0.85)
    assert s["agent_threshold_percent"] == round(100 * s["estimated_tokens"] / t["agent_tokens"], 1)
    store = guard.store_for(home / "state.db")
    snaps = store.list_snapshots(SID)
    assert s["snapshots"] == len(snaps) == 2
    assert s["snapshot_messages"] == sum(x.message_count for x in snaps)
    with closing(sqlite3.connect(home / "state.db")) as conn:
        by_reference = {r[0] for r in read_snapshot_references(conn)}
    if {x.snapshot_id for x in snaps} <= by_reference:  # Hermes keeps the rows, the guard stores no copy
        assert s["snapshot_bytes"] == 0
    else:
        assert s["snapshot_bytes"] > sum(len(m["content"]) for m in messages)
    assert s["buffered"] == 0 and s["lock_holders"] == []

    code, text = _status([], home, capsys)
    assert f"{SID}  compressions=2/0/1  snapshots=2  buffered=0" in text
    assert "2 done, 1 failed, 0 skipped" in text and f"failed x1: {failed['reason']}" in text


def test_status_mid_compression_shows_the_buffered_message_and_a_live_holder(
    guard: Any, llm: ScriptedLLMServer, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    async def scenario() -> tuple[Any, str]:
        gw = await start_gateway()
        await gw.send_text("hi")
        await gw.drain()
        sid = gw.bound_session_id() or ""
        for m in probe.seed_messages(tag="gw"):
            gw.runner.session_store.append_to_transcript(sid, m)
        gate = threading.Event()
        llm.configure(summary_gate=gate)
        try:
            await gw.send_text("trigger")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while guard.compressing.op_for(sid) is None and loop.time() < deadline:
                await asyncio.sleep(0.01)
            await gw.send_text("follow-up while compressing")
            inbox = Inbox(guard.store_for(home / "state.db"))
            while not inbox.entries() and loop.time() < deadline:  # stored by the gateway's handler task
                await asyncio.sleep(0.02)
            # the summary call has begun: whoever holds the lock (the guard, or Hermes in native mode) holds it now
            while not llm.summary_started.is_set() and loop.time() < deadline:
                await asyncio.sleep(0.02)
            seen["during"] = _status(["--json"], home, capsys)[1]
        finally:
            gate.set()
        await gw.drain()
        return gw, sid

    gw, sid = asyncio.run(scenario())
    during = {s["session_id"]: s for s in seen["during"]["sessions"]}[sid]
    assert during["buffered"] == 1
    (holder,) = during["lock_holders"]
    assert f"pid={os.getpid()}" in holder["holder"]
    if HOST_NATIVE_MODE:  # Hermes's own lease: its holder names only a pid, this very process
        assert holder["kind"] == "native"
    assert holder["liveness"] == "alive"
    assert holder["expires_in_seconds"] > 0 and not holder["expired"]
    # before the compaction the session is the most pressed one, above its agent threshold
    assert seen["during"]["sessions"][0]["session_id"] == sid and during["agent_threshold_percent"] > 100

    code, after = _status(["--json", "--session", sid], home, capsys)
    (s,) = after["sessions"]
    assert s["buffered"] == 0 and s["lock_holders"] == [] and s["compressions"]["done"] == 1
    assert s["agent_threshold_percent"] < during["agent_threshold_percent"]
    assert _status(["--json", "--session", "no-such-session"], home, capsys)[0] == 2
