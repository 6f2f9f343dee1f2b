"""One compression per session on the real host: two agents on one session
(concurrent, staggered, with a contender that skips), a crashed lock holder,
five sessions compressing at once, and anomaly B reproduced without the guard."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .compression_driver import capture_compression_records
from .conftest import HOST, HOST_HAS_IN_PLACE, HOST_NATIVE_MODE, HOST_ROW, MODE_PARAMS, new_agent
from .waiting import parked_in, place, wait_for

# The lease the guard holds (the seam table's lock): Hermes's compression_locks from 0.16.
NATIVE_LOCK = HOST_ROW is not None and HOST_ROW.behaviour.lock == "native"
# 0.20+ (native mode): Hermes takes and checks compression_locks itself, the guard holds no lease;
# a contender does not wait, Hermes skips it, and its next attempt adopts the winner's compaction.
HERMES_LOCK = NATIVE_LOCK or HOST_NATIVE_MODE
NATIVE_NO_WAIT = pytest.mark.skipif(HOST_NATIVE_MODE, reason="Hermes 0.20+'s compression lock does not wait: a "
                                    "concurrent contender is skipped (the next test states that there)")

SID = "20260528_155201_68dc5996"
SYSTEM = "You are a test agent."
SEED_MARKERS = [f"turn-{i}:" for i in range(probe.SEED_MESSAGES)]


# -- helpers ------------------------------------------------------------------------
@pytest.fixture
def lock_config(guard: Any) -> Iterator[Callable[..., None]]:
    """Set ``session_guard.lock.*`` for one test (the guard reads it per operation)."""
    saved = guard.config

    def set_lock(**kwargs: Any) -> None:
        guard.config = replace(guard.config, lock=replace(guard.config.lock, **kwargs))

    yield set_lock
    guard.config = saved


@pytest.fixture
def dbs(home: Path) -> Iterator[Callable[[], Any]]:
    """Open extra SessionDB connections to the same state.db (one per agent, as a
    gateway, a CLI and a cron job each have their own)."""
    opened: list[Any] = []

    def open_one() -> Any:
        database = probe.open_db(home / "state.db")
        opened.append(database)
        return database

    yield open_one
    for database in opened:
        try:
            database.close()
        except Exception:
            pass


def _user(tag: str) -> dict[str, Any]:
    return {"role": "user", "content": f"{tag}: a new question only this agent has seen so far"}


def _own_turn(tag: str) -> list[dict[str, Any]]:
    """A turn only this agent has (question and answer), not yet in state.db."""
    return [_user(tag), {"role": "assistant", "content": f"{tag}-answer: the reply to it"}]


OWN = ["a-new:", "a-new-answer:", "b-new:", "b-new-answer:"]


def _agents_on_one_session(db: Any, dbs: Callable[[], Any], llm: FakeLLMServer, mode: str,
                           sid: str = SID) -> tuple[list[Any], list[list[dict[str, Any]]]]:
    """Two agents that loaded the same 48-message session; each holds its own new
    (not yet persisted) turn at the end of its list."""
    probe.seed_session(db, sid, probe.seed_messages())
    agents, lists = [], []
    for tag in ("a-new", "b-new"):
        own_db = dbs()
        loaded = own_db.get_messages_as_conversation(sid)
        agent = new_agent(own_db, llm, sid, mode)
        probe.mark_flushed(agent, loaded)
        agents.append(agent)
        lists.append([*loaded, *_own_turn(tag)])
    return agents, lists


def _compress(agent: Any, messages: list[Any]) -> tuple[list[Any], str]:
    return agent._compress_context(messages, SYSTEM, approx_tokens=150_000)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # surfaced by the test
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, box


def _ops(runtime: Any) -> dict[str, list[dict[str, Any]]]:
    ops: dict[str, list[dict[str, Any]]] = {}
    for e in audit.read_events(runtime.audit_path):
        if e.get("op_id"):
            ops.setdefault(e["op_id"], []).append(e)
    return ops


def _outcomes(runtime: Any) -> list[dict[str, Any]]:
    return [evs[-1] for evs in _ops(runtime).values() if evs[-1]["event"] != "compression.started"]


# Where a compression waits while another holds the session's lock (in-process wait or lease poll).
_LOCK_WAIT = [place("acquire", "locks", "session_lock.py")]


def _parked_on_lock(thread: threading.Thread) -> bool:
    return parked_in(_LOCK_WAIT, thread)


def _texts(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r.get("content") or "") for r in rows]


def contract_violations(home: Path, sid: str, agents: list[Any], markers: list[str],
                        runtime: Any | None, all_sessions: list[str] | None = None) -> list[str]:
    """Everything the seed's multi-agent scenarios forbid, as readable findings.
    ``all_sessions``: every conversation of this home (default: just ``sid``)."""
    found: list[str] = []
    for i, agent in enumerate(agents):
        if agent.session_id != sid:
            found.append(f"agent {i} moved from {sid} to {agent.session_id}")
    rows = probe.sessions_table(home / "state.db")
    if sorted(r["id"] for r in rows) != sorted(all_sessions or [sid]) or any(r["parent_session_id"] for r in rows):
        found.append("sessions in state.db: " + ", ".join(
            f"{r['id']} (parent={r['parent_session_id']}, end={r['end_reason']})" for r in rows))
    if any(r["id"] == sid and r["ended_at"] for r in rows):
        found.append(f"{sid} was ended")
    live = "\n".join(_texts(probe.live_messages(home / "state.db", sid)))
    kept = ""
    if runtime is not None:
        store = runtime.store_for(home / "state.db")
        kept = "\n".join(
            str(m.get("content")) for s in store.list_snapshots(sid) for m in store.snapshot_messages(s.snapshot_id)
        )
    lost = [m for m in markers if m not in live and m not in kept]
    if lost:
        found.append(f"{len(lost)} messages neither live nor in a snapshot: {lost[:4]}")
    if runtime is not None:
        for op_id, events in _ops(runtime).items():
            named = ({e["session_id"] for e in events} | {e.get("session_id_after") for e in events}) - {None}
            if sid in named and named != {sid}:
                found.append(f"audit op {op_id} names {sorted(named)}")
    return found


def _leftover_locks(home: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(home / "state.db"))
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        rows: list[tuple[Any, ...]] = []
        for table in ("session_guard_locks", "compression_locks"):
            if table in tables:
                rows += conn.execute(f"SELECT * FROM {table}").fetchall()
        return rows
    finally:
        conn.close()


# -- two agents, one session ----------------------------------------------------------
@NATIVE_NO_WAIT
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_concurrent_contender_waits_then_adopts_without_a_second_summary(
    guard: Any, lock_config: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    lock_config(wait_seconds=30.0)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)

    ta, box_a = _in_thread(lambda: _compress(a, list_a))
    assert llm.summary_started.wait(60), "the first compression never reached the summary call"
    tb, box_b = _in_thread(lambda: _compress(b, list_b))
    # b is parked on the lock while a's summary is in flight
    assert wait_for(lambda: len(_ops(guard)) == 2)
    assert wait_for(lambda: _parked_on_lock(tb)), "the contender never reached the compression lock"
    assert _outcomes(guard) == [] and len(llm.summary_requests()) == 1
    gate.set()
    ta.join(30)
    tb.join(30)
    assert "error" not in box_a and "error" not in box_b, (box_a, box_b)

    outcomes = {e["event"]: e for e in _outcomes(guard)}
    assert set(outcomes) == {"compression.done", "compression.adopted"}
    done, adopted = outcomes["compression.done"], outcomes["compression.adopted"]
    assert adopted["lock_holder"] != done["lock_holder"] and adopted["waited_ms"] > 0
    # 0.16+: the guard holds Hermes's own compression_locks row; 0.13-0.15: its own lease
    assert done["lock"] == adopted["lock"] == ("native" if NATIVE_LOCK else "guard")
    assert adopted["basis"] == "record" and adopted["generation"] == 1 and adopted["new_messages"] == 2
    assert len(llm.summary_requests()) == 1  # no second summary call
    compressed_a, _ = box_a["result"]
    adopted_b, _ = box_b["result"]
    live = _texts(probe.live_messages(home / "state.db", SID))
    # a's compaction, then b's own new turn; both agents hold exactly that
    assert live == _texts(compressed_a) + _texts(_own_turn("b-new"))
    assert _texts(adopted_b) == live
    assert all(sum(marker in t for t in live) == 1 for marker in OWN)
    assert contract_violations(home, SID, [a, b], [*SEED_MARKERS, *OWN], guard) == []
    assert _leftover_locks(home) == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_contender_that_cannot_wait_skips_naming_the_holder_and_stays_on_the_id(
    guard: Any, lock_config: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    lock_config(wait_seconds=0.2)
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)
    ta, box_a = _in_thread(lambda: _compress(a, list_a))
    assert llm.summary_started.wait(60)
    try:
        holder = db.get_compression_lock_holder(SID) if HOST_NATIVE_MODE else None
        with probe.capture_host_compression_logs() as lines:
            returned, _ = _compress(b, list_b)
    finally:
        gate.set()
        ta.join(60)
    assert "error" not in box_a, box_a
    assert _texts(returned) == _texts(list_b) and _texts(returned)[-2:] == _texts(_own_turn("b-new"))
    assert b.session_id == SID
    (skipped,) = [e for e in _outcomes(guard) if e["event"] == "compression.skipped"]
    (done,) = [e for e in _outcomes(guard) if e["event"] == "compression.done"]
    assert skipped["session_id"] == SID
    if HOST_NATIVE_MODE:
        # Hermes's own lease, taken by Hermes for the winner (the guard holds none), refused the loser
        assert holder is not None and "guard-op=" not in holder
        assert done["lock"] == "host" and "Hermes's lock" in skipped["reason"]
    else:
        assert returned is list_b
        assert skipped["holder"] == done["lock_holder"] and f"guard-op={done['op_id']}" in skipped["holder"]
        assert 150 <= skipped["waited_ms"] < 2000
        assert lines == []  # the host was never asked to compress for the loser
    assert len(llm.summary_requests()) == 1

    # its next attempt, after the winner finished, adopts instead of compacting again
    adopted, _ = _compress(b, list_b)
    assert len(llm.summary_requests()) == 1
    assert _texts(adopted) == _texts(probe.live_messages(home / "state.db", SID))
    assert contract_violations(home, SID, [a, b], [*SEED_MARKERS, *OWN], guard) == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_staggered_stale_contender_adopts_and_its_next_turn_persists_once(
    guard: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)
    compressed_a, _ = _compress(a, list_a)
    assert len(llm.summary_requests()) == 1

    adopted, _ = _compress(b, list_b)  # b still holds the 48 pre-compaction turns
    assert len(llm.summary_requests()) == 1
    assert b.session_id == SID
    assert _texts(adopted) == _texts(compressed_a) + _texts(_own_turn("b-new"))

    expected = _texts(adopted) + ["b asks again", "answer to b"]
    llm.configure(reply_text="answer to b")
    result = b.run_conversation("b asks again", conversation_history=adopted)
    assert result["final_response"] == "answer to b"
    assert _texts(probe.live_messages(home / "state.db", SID)) == expected
    assert contract_violations(home, SID, [a, b], [*SEED_MARKERS, *OWN], guard) == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_turns_other_agents_persisted_stay_live_after_the_compaction(
    guard: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)
    # b finished its turn and persisted it; a has not seen it
    for m in list_b[-2:]:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])

    compressed_a, _ = _compress(a, list_a)
    live = _texts(probe.live_messages(home / "state.db", SID))
    assert live[-2:] == _texts(_own_turn("b-new")) and _texts(compressed_a) == live
    (done,) = [e for e in _outcomes(guard) if e["event"] == "compression.done"]
    assert done["carried_over"] == 2

    adopted, _ = _compress(b, list_b)
    assert _texts(adopted) == live  # nothing new, nothing duplicated
    assert len(llm.summary_requests()) == 1
    assert contract_violations(home, SID, [a, b], [*SEED_MARKERS, *OWN], guard) == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_a_crashed_holder_blocks_the_session_for_at_most_its_lease(
    guard: Any, lock_config: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    lock_config(wait_seconds=5.0)
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    # a holder nothing proves dead (a running pid, no identity fields: a process elsewhere)
    dead = f"pid={os.getppid()}:tid=1:guard-op=crashed"
    # a process took the lock with a 1 s lease and died without releasing it (native mode: a
    # 300 s lease, which Hermes reclaims at once because the holder's process is gone)
    if HOST_NATIVE_MODE:
        try:  # 0.22 probes a holder's pid only when it names its pid namespace, as Hermes's own do
            from hermes_state_pidns import holder_namespace_token  # type: ignore[import-not-found]
        except ImportError:
            holder_namespace_token = str
        dead = f"pid=999999{holder_namespace_token()}:tid=1:guard-op=crashed"
        assert db.try_acquire_compression_lock(SID, dead, ttl_seconds=300.0)
    elif NATIVE_LOCK:
        assert db.try_acquire_compression_lock(SID, dead, ttl_seconds=1.0)
    else:
        assert guard.store_for(home / "state.db").try_acquire_lease(SID, dead, 1.0)

    compressed, _ = _compress(agent, messages)
    assert len(compressed) < len(messages)
    (done,) = _outcomes(guard)
    assert done["event"] == "compression.done" and agent.session_id == SID
    if HOST_NATIVE_MODE:
        assert done["lock"] == "host" and len(llm.summary_requests()) == 1
    else:
        assert done["lock_holder"] != dead
        assert 500 <= done["waited_ms"] < 4000
    assert _leftover_locks(home) == []


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_current_agent_compacts_again_even_after_hermes_merged_its_turns(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    """The generation check must not mistake an up-to-date list for a stale one:
    after the first compaction, more turns (two of them consecutive user turns that
    Hermes's alternation repair merges in memory) and a second compaction."""
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    compressed, _ = _compress(agent, messages)

    more = probe.seed_messages(40, tag="more")
    more.insert(1, {"role": "user", "content": "more-extra: a second user turn in a row"})
    for m in more:
        db.append_message(session_id=SID, role=m["role"], content=m["content"])
    # As a resumed turn holds it: 0.21+ keys its in-place commit on the row ids a history
    # loaded from state.db carries (rows it cannot place are cloned after the summary).
    current = db.get_messages_as_conversation(SID) if HOST >= (0, 21, 0) else [*compressed, *more]
    assert agent._repair_message_sequence(current) >= 1  # what Hermes does before its next request
    probe.mark_flushed(agent, current)
    llm.configure(summary_fn=lambda body: "## Goal\nsecond summary\n")
    again, _ = _compress(agent, current)

    outcomes = [e["event"] for e in _outcomes(guard)]
    assert outcomes == ["compression.done", "compression.done"], outcomes
    assert [e.get("generation") for e in _outcomes(guard)] == [1, 2]
    assert len(llm.summary_requests()) == 2
    assert _texts(probe.live_messages(home / "state.db", SID)) == _texts(again)
    markers = [*SEED_MARKERS, *(f"more-{i}:" for i in range(40)), "more-extra:"]
    assert contract_violations(home, SID, [agent], markers, guard) == []


# -- five sessions at once ----------------------------------------------------------
def _hermes_compression_workers() -> int:
    """How many compressions Hermes runs at once in one process (0.20+: a pool of 4; a fifth
    waits for a worker inside Hermes's compression timeout)."""
    try:
        from agent import conversation_compression
    except ImportError:  # before 0.18 there is no such module, nor a pool
        return 5
    return int(getattr(conversation_compression, "_COMPRESS_EXECUTOR_MAX_WORKERS", 5))


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_five_sessions_compress_at_once_without_aliasing(
    guard: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    import hermes_logging

    gate = threading.Event()
    llm.configure(summary_gate=gate)
    n = min(5, _hermes_compression_workers())  # Hermes 0.20+ runs 4 at once per process
    sids = [f"20260528_16123{i}_5e55{i:04x}" for i in range(n)]
    agents, lists = [], []
    for i, sid in enumerate(sids):
        messages = probe.seed_messages(tag=f"s{i}")
        probe.seed_session(db, sid, messages)
        agent = new_agent(dbs(), llm, sid, mode)
        probe.mark_flushed(agent, messages)
        agents.append(agent)
        lists.append(messages)
    barrier = threading.Barrier(n)

    def compress(i: int) -> Any:
        # an executor thread that last served another session (its log tag is stale)
        hermes_logging.set_session_context(sids[(i + 1) % n])
        barrier.wait(10)
        return _compress(agents[i], lists[i])

    with capture_compression_records() as records:
        runs = [_in_thread(lambda i=i: compress(i)) for i in range(n)]
        try:
            # all the summaries in flight at once: nothing serialises distinct sessions
            assert llm.wait_for_requests(n, kind="summary", timeout=120)
        finally:
            gate.set()
            for t, _ in runs:
                t.join(60)
    assert all("error" not in box for _, box in runs), [box.get("error") for _, box in runs]

    outcomes = _outcomes(guard)
    assert sorted(e["session_id"] for e in outcomes if e["event"] == "compression.done") == sorted(sids)
    for i, sid in enumerate(sids):
        markers = [f"s{i}-{n}:" for n in range(48)]
        assert contract_violations(home, sid, [agents[i]], markers, guard, all_sessions=sids) == []
        others = [f"s{j}-" for j in range(n) if j != i]
        live = "\n".join(_texts(probe.live_messages(home / "state.db", sid)))
        assert not any(o in live for o in others)
    for op_id, events in _ops(guard).items():
        assert len({e["session_id"] for e in events}) == 1, op_id
    # every line of every operation, Hermes's and the guard's, names its own session
    # in the text and in the [session] tag, whatever the thread served before
    checked = 0
    for rec in records:
        named = {tok.split("=", 1)[1] for tok in rec["message"].split() if tok.startswith(("session=", "session_id="))}
        if named - {"None"}:
            assert named == {rec["tag"]}, rec
            checked += 1
    assert checked >= n * 4  # host started/done and guard started/done of each operation


# -- anomaly B without the guard ------------------------------------------------------
def _two_agents_at_once(db: Any, dbs: Any, llm: FakeLLMServer, mode: str) -> tuple[list[Any], list[Any]]:
    gate = threading.Event()
    llm.configure(summary_gate=gate)
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, mode)
    runs = [_in_thread(lambda: _compress(a, list_a))]
    assert llm.summary_started.wait(60)
    runs.append(_in_thread(lambda: _compress(b, list_b)))
    contender = runs[1][0]
    # b is in flight too: at its own summary call (unguarded, no lock), parked on the guard's
    # lock, or already turned away by Hermes's lock (0.20+, which does not wait)
    assert wait_for(lambda: len(llm.summary_requests()) >= 2 or _parked_on_lock(contender)
                     or not contender.is_alive()), "the second compression never got under way"
    gate.set()
    for t, _ in runs:
        t.join(60)
    assert all("error" not in box for _, box in runs)
    return [a, b], [box["result"] for _, box in runs]


@pytest.mark.skipif(HERMES_LOCK, reason="0.16+ ships a native lock; anomaly B there is the stale loser")
def test_anomaly_b_two_agents_fork_one_session_without_the_guard(
    no_guard: None, db: Any, dbs: Any, llm: FakeLLMServer, home: Path
) -> None:
    """Hermes 0.13-0.15 as shipped: both agents compress the same session and fork it."""
    agents, _ = _two_agents_at_once(db, dbs, llm, "rotate")
    rows = {r["id"]: r for r in probe.sessions_table(home / "state.db")}
    children = [r for r in rows.values() if r["parent_session_id"] == SID]
    assert len(children) == 2  # two children of one parent
    assert rows[SID]["end_reason"] == "compression"
    assert agents[0].session_id != agents[1].session_id
    assert len(llm.summary_requests()) == 2
    assert contract_violations(home, SID, agents, [*SEED_MARKERS, *OWN], None) != []


@pytest.mark.skipif(not HOST_HAS_IN_PLACE, reason="the stale loser compacts in place (0.18+)")
def test_anomaly_b_stale_loser_compacts_again_without_the_guard(
    no_guard: None, db: Any, dbs: Any, llm: FakeLLMServer, home: Path
) -> None:
    """Hermes 0.19 as shipped: a contender arriving after the winner with its stale
    list runs a second summary over turns already compacted (a lost update)."""
    (a, b), (list_a, list_b) = _agents_on_one_session(db, dbs, llm, "in_place")
    for agent in (a, b):
        agent.compression_in_place = True
    compressed_a, _ = _compress(a, list_a)
    _compress(b, list_b)
    assert len(llm.summary_requests()) == 2
    live = _texts(probe.live_messages(home / "state.db", SID))
    assert not any("a-new-answer:" in t for t in live)  # a's turn was summarised away by b's second pass
    assert live != _texts(compressed_a)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_anomaly_b_scenario_holds_the_contract_with_the_guard(
    guard: Any, lock_config: Any, db: Any, dbs: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    lock_config(wait_seconds=30.0)
    agents, results = _two_agents_at_once(db, dbs, llm, mode)
    if HOST_NATIVE_MODE and any(e["event"] == "compression.skipped" for e in _outcomes(guard)):
        # Hermes's lock skipped the contender (it does not wait); its next attempt adopts. A
        # contender reaching Hermes's lease after the winner committed adopts at once.
        results[1] = _compress(agents[1], results[1][0])
    assert contract_violations(home, SID, agents, [*SEED_MARKERS, *OWN], guard) == []
    assert len(llm.summary_requests()) == 1
    live = _texts(probe.live_messages(home / "state.db", SID))
    assert [_texts(r[0]) for r in results][1] == live
