"""A process killed (SIGKILL) at each phase of a guarded compression, then restarted
on the same ``HERMES_HOME``.

Phases: before the summary call, during it, between the snapshot write and the
live-transcript write, after both writes but before the compression lock is
released (an agent process each, ``crash_driver.py``), and while a gateway holds
messages buffered for the compressing session. After the restart (a new agent
process that continues the conversation and compresses again, or a new gateway
runner that replays the buffer) the contract holds: the original session id, one
live session, every pre-compression message live or in a snapshot, the dead
process's lock taken over at once (within 5 s, its lease far from over), each buffered message answered
once and in order, and ``hermes-session-guard doctor`` reporting a clean home.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.inbox.repository import DELIVERED, Inbox
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer, iter_message_text
from hermes_session_guard.selftest.gateway import GatewayHarness, start_gateway
from hermes_session_guard.store import GuardStore

from .conftest import HOST_HAS_IN_PLACE, HOST_NATIVE_MODE, MODE_PARAMS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("crash_driver.py")
SID = "20260528_093510_66bfaec7"
TAG = "crash"
GROW = 24  # turns the restarted process adds before it compresses again
LEASE = 300.0  # seconds: far longer than the test waits, so only taking over the dead holder is in time
WAIT = 15.0  # a contender's wait: longer than PROMPT, shorter than the lease
PROMPT = 5.0  # seconds: the restarted compression gets the lock this soon after asking for it
LOCK = {"lock": {"lease_seconds": LEASE, "wait_seconds": WAIT}}
AGENT_PHASES = ["before_summary", "during_summary", "between_writes", "before_release"]


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    env.pop("HERMES_SESSION_ID", None)
    return env


def _answer(body: dict[str, Any]) -> str:
    """The fake model answers 're: <marker of the turn's own question>'."""
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            words = " ".join(iter_message_text(m.get("content"))).split()
            markers = [w for w in words if w.endswith("-next:") or w.startswith("msg-") or w == "trigger"]
            return f"re: {markers[-1].rstrip(':')}" if markers else "re: ?"
    return "re: ?"


def _driver(home: Path, llm: FakeLLMServer, mode: str, tag: str, out: Path, *, kill_at: str = "none",
            reached: Path | None = None, grow: int = 0) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(DRIVER), "--home", str(home), "--sid", SID, "--tag", tag, "--base-url",
           llm.base_url, "--out", str(out), "--kill-at", kill_at, "--grow", str(grow)]
    if reached is not None:
        cmd += ["--reached", str(reached)]
    if HOST_HAS_IN_PLACE:
        cmd.append("--in-place" if mode == "in_place" else "--rotate")
    with open(out.with_suffix(".err"), "wb") as err:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=_env(home), stdout=subprocess.DEVNULL, stderr=err)


def _stderr(out: Path) -> str:
    path = out.with_suffix(".err")
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


# -- reading the home after the fact ----------------------------------------------------
def _query(home: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(home / "state.db"), timeout=10)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        needed = [t for t in ("session_guard_snapshots", "session_guard_locks", "compression_locks",
                              "session_guard_compressions") if t in sql]
        if any(t not in tables for t in needed):
            return []
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _snapshot_texts(home: Path, sid: str = SID) -> list[str]:
    """Every snapshot of the session, copied or by reference, through the store's one reader."""
    if not _query(home, "SELECT 1 FROM session_guard_snapshots LIMIT 1"):
        return []
    store = GuardStore(home / "state.db")
    try:
        return [str(m.get("content")) for snap in store.list_snapshots(sid)
                for m in store.snapshot_messages(snap.snapshot_id)]
    finally:
        store.close()


def _live_texts(home: Path, sid: str = SID) -> list[str]:
    return [str(m["content"]) for m in probe.live_messages(home / "state.db", sid)]


def _locks(home: Path) -> list[tuple[str, str, float]]:
    rows = [("guard", *r) for r in _query(home, "SELECT holder, expires_at FROM session_guard_locks")]
    rows += [("native", *r) for r in _query(home, "SELECT holder, expires_at FROM compression_locks")]
    return rows


def _phase_rows(home: Path) -> list[tuple[str, str, Any]]:
    return [(r[0], r[1], r[2]) for r in _query(
        home, "SELECT op_id, phase, finished_at FROM session_guard_compressions WHERE session_id = ?"
              " ORDER BY started_at", SID)]


def _missing(home: Path, markers: list[str], sid: str = SID) -> list[str]:
    """Markers of messages that are neither live nor in a snapshot of the session."""
    everything = [*_live_texts(home, sid), *_snapshot_texts(home, sid)]
    return [m for m in markers if not any(t.startswith(m) for t in everything)]


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def _assert_taken_over_promptly(events: list[dict[str, Any]], dead_holder: str, restarted_at: float) -> float:
    """The first compression after the crash took the dead holder's lock over at once
    (its lease is far from over), within PROMPT seconds of asking for it. Returns the
    seconds from the restart's launch to the lock being taken (printed for the report)."""
    asked = _ts(events[0])
    # native mode (0.20+): no wait of the guard's; it releases the dead holder and Hermes acquires
    got = asked + events[-1].get("waited_ms", 0.0) / 1000
    assert got - asked <= PROMPT, events[-1]
    assert events[-1].get("took_over_from") == dead_holder, events[-1]
    return got - restarted_at


def _doctor(home: Path) -> dict[str, Any]:
    """The operator's CLI, as a separate process on the same home."""
    done = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "doctor", "--json"],
                          env=_env(home), capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    report["returncode"] = done.returncode
    return report


def _ops(home: Path) -> dict[str, list[dict[str, Any]]]:
    ops: dict[str, list[dict[str, Any]]] = {}
    for e in audit.read_events(home / "logs" / "session_guard.jsonl"):
        if e.get("op_id") and str(e.get("event", "")).startswith("compression."):
            ops.setdefault(e["op_id"], []).append(e)
    return ops


def _assert_home(home: Path, sid: str, markers: list[str]) -> None:
    """What must hold once the home was used again after the crash."""
    rows = probe.sessions_table(home / "state.db")
    # the original id, one live session: no child, no fork, not ended
    assert [(r["id"], r["parent_session_id"], r["ended_at"]) for r in rows] == [(sid, None, None)], rows
    # every message of the conversation is live or in a snapshot (counted), and none is live twice
    assert _missing(home, markers, sid) == []
    live = _live_texts(home, sid)
    doubled = [m for m in markers if sum(t.startswith(m) for t in live) > 1]
    assert doubled == [], doubled
    # nothing left locked
    assert _locks(home) == []
    # every audited operation names this session only
    for events in _ops(home).values():
        assert {e["session_id"] for e in events} | {e.get("session_id_after", sid) for e in events} == {sid}
    report = _doctor(home)
    assert report["returncode"] == 0 and report["ok"] is True, report["findings"]


# -- an agent process killed at each phase ----------------------------------------------
@pytest.mark.parametrize("phase", AGENT_PHASES)
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_agent_killed_mid_compression_recovers_on_restart(
    llm: FakeLLMServer, home: Path, tmp_path: Path, mode: str, phase: str
) -> None:
    probe.write_config(home, llm.base_url, in_place=(mode == "in_place") if HOST_HAS_IN_PLACE else None,
                       extra={"session_guard": LOCK})
    db = probe.open_db(home / "state.db")
    probe.seed_session(db, SID, probe.seed_messages(tag=TAG))
    db.close()
    seeded = [f"{TAG}-{i}:" for i in range(probe.SEED_MESSAGES)]
    llm.configure(reply_fn=_answer)

    # 1. the process that dies
    gate = threading.Event()
    if phase == "during_summary":
        llm.configure(summary_gate=gate)
    out, reached = tmp_path / "crashed.json", tmp_path / "reached"
    proc = _driver(home, llm, mode, "first", out, kill_at=phase, reached=reached)
    try:
        if phase == "during_summary":
            assert llm.summary_started.wait(60), _stderr(out)
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        gate.set()
        llm.configure(summary_gate=None)
    assert code == -signal.SIGKILL, (code, _stderr(out))
    assert not out.exists()  # it never got to write a result
    if phase != "during_summary":
        assert reached.read_text() == phase

    # what the crash left: the session untouched or compacted, never lost or forked
    snapshots = _query(home, "SELECT message_count FROM session_guard_snapshots WHERE session_id = ?", SID)
    still_live = sum(any(t.startswith(m) for t in _live_texts(home)) for m in seeded)
    # a copy holds the history and the turn's question; native mode's reference holds the rows
    # state.db had (Hermes had not stored the question of the turn that was killed)
    kept = len(seeded) if HOST_NATIVE_MODE else len(seeded) + 1
    if phase in ("before_summary", "during_summary"):
        assert (snapshots, still_live) == ([], len(seeded))
    elif phase == "between_writes" and HOST_NATIVE_MODE:
        # the reference rides Hermes's archive_and_compact transaction: killed inside it, neither committed
        assert (snapshots, still_live) == ([], len(seeded))
    elif phase == "between_writes":  # the snapshot first, the live write never
        assert (snapshots, still_live) == ([(kept,)], len(seeded))
    else:
        assert snapshots == [(kept,)] and still_live < len(seeded)
    (crashed_op,) = [op for op, evs in _ops(home).items() if evs[0]["event"] == "compression.started"]
    # it died before its outcome was audited, or (before_release) after it, with the lock still held
    # (native mode: Hermes releases its own lease inside its compaction, before the guard audits the outcome)
    audited_done = phase == "before_release" and not HOST_NATIVE_MODE
    expected = ["compression.started", "compression.done"] if audited_done else ["compression.started"]
    assert [e["event"] for e in _ops(home)[crashed_op]] == expected
    # The phase row never ended; except that native mode writes it in Hermes's commit of its lease,
    # right before the summary (nothing is waited for before it), so a process killed earlier left
    # none, and that the outcome is written with the compaction's own records, before the lease is released.
    if HOST_NATIVE_MODE and phase == "before_summary":
        phases = []
    else:
        phases = ["done"] if audited_done else ["started"]
    assert [phase_ for _, phase_, _ in _phase_rows(home)] == phases
    assert [(r["id"], r["ended_at"]) for r in probe.sessions_table(home / "state.db")] == [(SID, None)]
    assert _missing(home, seeded) == []
    left = _locks(home)
    # native mode (0.20+): Hermes takes its own lease after the guard's before-compression hook
    unlocked = HOST_NATIVE_MODE and phase == "before_summary"
    assert [holder.startswith(f"pid={proc.pid}:") for _, holder, _ in left] == ([] if unlocked else [True]), left
    # the operator's doctor names the dead holder (its lease is far from over)
    report = _doctor(home)
    if unlocked:
        assert report["returncode"] == 0 and report["findings"] == [], report["findings"]
    else:
        assert report["returncode"] == 1 and [f["signature"] for f in report["findings"]] == ["dead_lock_holder"], \
            report["findings"]

    # 2. the restart: a new process continues the conversation and compresses again
    out2 = tmp_path / "restarted.json"
    grown = [f"{TAG}-{i}:" for i in range(probe.SEED_MESSAGES)] + [f"second-grow-{i}:" for i in range(GROW)]
    restarted_at = time.time()
    restart = _driver(home, llm, mode, "second", out2, grow=GROW)
    assert restart.wait(timeout=120) == 0, _stderr(out2)
    result = json.loads(out2.read_text())
    assert result["guard_loaded"] and result["session_id_after"] == SID
    assert result["env_session_id"] in (None, SID)
    assert result["final_response"] == "re: second-next", result

    outcomes = [evs for op, evs in _ops(home).items() if op != crashed_op]
    done = [evs for evs in outcomes if evs[-1]["event"] == "compression.done"]
    assert done, [[e["event"] for e in evs] for evs in outcomes]
    if not unlocked:
        # the restarted compression took the dead holder's lock over, without waiting out its lease
        (_, dead_holder, dead_expires), = left
        assert dead_expires - restarted_at > WAIT  # the dead lease alone would have blocked the whole wait
        took = _assert_taken_over_promptly(done[0], dead_holder, restarted_at)
        print(f"restart-to-compression {phase} {mode}: lock taken {took:.2f}s after the restart's launch, "
              f"waited {done[0][-1].get('waited_ms', 0.0) / 1000:.3f}s for it")

    # the restarted turn is live exactly once, after everything before it
    live = _live_texts(home)
    assert sum(t.startswith("second-next:") for t in live) == 1
    assert live[-1] == "re: second-next"
    _assert_home(home, SID, grown)


# -- a gateway killed while messages wait for its compression -----------------------------
_GATEWAY_KILLED_WHILE_BUFFERING = r"""
import asyncio, os, sys
from hermes_session_guard.selftest import probe
probe.discover_guard()
import hermes_session_guard
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.selftest.gateway import start_gateway

async def main():
    runtime = hermes_session_guard.current_runtime()
    gw = await start_gateway()
    await gw.send_text("hi")
    await gw.drain()
    sid = gw.bound_session_id()
    for m in probe.seed_messages(int(sys.argv[2]), tag=sys.argv[1]):
        gw.runner.session_store.append_to_transcript(sid, m)
    print("SID", sid, flush=True)
    sys.stdin.readline()  # the parent holds the summary call, then says go
    asyncio.get_running_loop().create_task(gw.send_text("trigger"))
    while runtime.compressing.op_for(sid) is None:
        await asyncio.sleep(0.01)
    for k in range(int(sys.argv[3])):
        await gw.send_text(f"msg-{k}")
    inbox = Inbox(runtime.store_for(probe.Path(os.environ["HERMES_HOME"]) / "state.db"))
    print("BUFFERED", len(inbox.entries()), flush=True)
    await asyncio.sleep(600)  # the parent kills this process (SIGKILL)

asyncio.run(main())
"""
GATEWAY_HISTORY = 200
BUFFERED = 3
GATEWAY_STAGES = ["compressing", "draining"]


@pytest.mark.parametrize("stage", GATEWAY_STAGES)
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_gateway_killed_with_messages_buffered_replays_them_once_on_restart(
    guard: Any, llm: FakeLLMServer, home: Path, mode: str, stage: str
) -> None:
    """A gateway holds three messages for a compressing session and is killed either
    inside the compression's summary call (``compressing``: lease held, all three
    buffered) or once the compression ended, inside the turn of the first buffered
    message (``draining``: one dispatched, two still buffered). A new gateway runner on
    the same home delivers each message exactly once, in order."""
    probe.write_config(home, llm.base_url, in_place=(mode == "in_place") if HOST_HAS_IN_PLACE else None,
                       extra={"session_guard": LOCK})
    saved = guard.config
    guard.config = replace(saved, lock=replace(saved.lock, lease_seconds=LEASE, wait_seconds=WAIT))
    tag = "gwcrash"
    sent = [f"msg-{k}" for k in range(BUFFERED)]
    gate, hold, in_first_turn = threading.Event(), threading.Event(), threading.Event()

    def reply(body: dict[str, Any]) -> str:
        text = _answer(body)
        if text == f"re: {sent[0]}" and not hold.is_set():  # the draining gateway dies in this turn
            in_first_turn.set()
            hold.wait(60)
        return text

    llm.configure(prompt_tokens=126_000, reply_fn=reply)  # the next message triggers session hygiene
    proc = subprocess.Popen([sys.executable, "-c", _GATEWAY_KILLED_WHILE_BUFFERING, tag, str(GATEWAY_HISTORY),
                             str(BUFFERED)], env=_env(home), text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.startswith("SID "), line
        sid = line.split()[1]
        llm.configure(prompt_tokens=None, summary_gate=gate)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["BUFFERED", str(BUFFERED)]
        assert llm.summary_started.wait(30)  # the compression is inside its summary call
        if stage == "draining":
            gate.set()
            assert in_first_turn.wait(60), "the first buffered message was never dispatched"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        gate.set()
        hold.set()
        llm.configure(summary_gate=None)

    store = guard.store_for(home / "state.db")
    states = [(e.text, e.state) for e in Inbox(store).entries()]
    left = _locks(home)
    if stage == "compressing":
        assert states == [(t, "buffered") for t in sent]
        assert [holder.startswith(f"pid={proc.pid}:") for _, holder, _ in left] == [True], left
    else:
        assert states == [(sent[0], "dispatched"), *[(t, "buffered") for t in sent[1:]]]
        assert left == []  # the compression had ended
    # a message whose turn already wrote it (0.19 persists the user turn before its model call)
    # is settled from the transcript, not run twice; every other one is answered on restart
    already = [t for t in sent if t in _live_texts(home, sid)]
    assert already in ([], sent[:1])
    ops_before = set(_ops(home))

    async def restart() -> tuple[GatewayHarness, GatewayHarness]:
        gw_b = await start_gateway()
        await gw_b.drain()
        gw_c = await start_gateway()  # a second restart has nothing left to replay
        await gw_c.drain()
        return gw_b, gw_c

    restarted_at = time.time()
    try:
        gw_b, gw_c = asyncio.run(restart())
    finally:
        guard.config = saved

    # each buffered message delivered once, in order, on the original session
    answers = [r for r in gw_b.replies() if r.startswith("re: ")]
    assert answers == [f"re: {t}" for t in sent if t not in already], gw_b.replies()
    assert gw_c.replies() == []
    assert gw_b.bound_session_id() == sid
    assert {e.state for e in Inbox(store).entries()} == {DELIVERED}
    live = _live_texts(home, sid)
    assert [live.count(t) for t in sent] == [1] * BUFFERED
    assert [live.count(f"re: {t}") for t in sent] == [0 if t in already else 1 for t in sent]
    order = [live.index(t) for t in sent]
    assert order == sorted(order)
    first = [r for r in llm.chat_requests() if _answer(r.body) == f"re: {sent[len(already)]}"][-1]
    seen = " ".join(" ".join(iter_message_text(m.get("content"))) for m in first.body["messages"])
    assert all(t in seen for t in sent[: len(already) + 1])  # the restarted turn sees what came before it
    if stage == "compressing":
        # the restarted gateway compressed again at once, taking the dead holder's lock over
        restarted = [evs for op, evs in _ops(home).items() if op not in ops_before]
        done = [evs for evs in restarted if evs[-1]["event"] == "compression.done"]
        assert done, [[e["event"] for e in evs] for evs in restarted]
        (_, dead_holder, dead_expires), = left
        assert dead_expires - restarted_at > WAIT
        took = _assert_taken_over_promptly(done[0], dead_holder, restarted_at)
        print(f"restart-to-compression gateway-{stage} {mode}: lock taken {took:.2f}s after the restart, "
              f"waited {done[0][-1].get('waited_ms', 0.0) / 1000:.3f}s for it")
    _assert_home(home, sid, [f"{tag}-{i}:" for i in range(GATEWAY_HISTORY)])
