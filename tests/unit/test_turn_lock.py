"""The per-session turn queue: arrival order, the wait bound, hand-over from an HTTP
handler to its run_conversation, nested turns, and the cross-process lease."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.locks.turn_lock import TurnBusy, TurnLocks, retry_after, turn_leases, turn_locks_for
from hermes_session_guard.seams.turns import fresher_history
from hermes_session_guard.store import GuardStore


def queued(locks: TurnLocks, session_id: str) -> int:
    """How many tickets (granted or waiting) the session's queue holds."""
    with locks._cond:
        return len(locks._queues.get(session_id) or ())


@pytest.fixture
def store(tmp_path: Path) -> GuardStore:
    s = GuardStore(tmp_path / "state.db")
    yield s
    s.close()


def test_turns_of_one_session_run_in_arrival_order(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))
    first = locks.wait(locks.enqueue("s"), 5, 30, 1)
    order: list[int] = []
    tickets = [locks.enqueue("s") for _ in range(8)]  # arrival order 0..7
    threads = []
    for i, t in reversed(list(enumerate(tickets))):  # threads start in the opposite order
        def run(i: int = i, t=t) -> None:
            held = locks.wait(t, 30, 30, 1)
            order.append(i)
            locks.release(held)
        threads.append(threading.Thread(target=run))
        threads[-1].start()
    locks.release(first)
    for th in threads:
        th.join(30)
    assert order == list(range(8))
    assert queued(locks, "s") == 0


def test_other_sessions_do_not_wait(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))
    held = locks.wait(locks.enqueue("a"), 5, 30, 1)
    other = locks.wait(locks.enqueue("b"), 0, 30, 1)  # no wait budget at all, still granted
    assert other.held
    locks.release(other)
    locks.release(held)


def test_over_the_bound_is_refused_and_leaves_the_queue(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))
    held = locks.wait(locks.enqueue("s"), 5, 30, 1)
    with pytest.raises(TurnBusy) as info:
        locks.wait(locks.enqueue("s"), 0.05, 30, 7)
    assert info.value.session_id == "s" and info.value.retry_after == 7 and "s is busy" in str(info.value)
    assert queued(locks, "s") == 1
    locks.release(held)
    assert queued(locks, "s") == 0


def test_another_process_holding_the_lease_makes_the_turn_wait(store: GuardStore, tmp_path: Path) -> None:
    other_store = GuardStore(tmp_path / "state.db")  # a second connection, as another process has
    other = TurnLocks(turn_leases(other_store))
    mine = TurnLocks(turn_leases(store))
    held = other.wait(other.enqueue("s"), 5, 30, 1)
    with pytest.raises(TurnBusy) as info:
        mine.wait(mine.enqueue("s"), 0.1, 30, 1)
    assert info.value.scope == "turn"
    other.release(held)
    got = mine.wait(mine.enqueue("s"), 5, 30, 1)
    assert got.held
    mine.release(got)
    other_store.close()


def test_a_handler_reservation_is_claimed_by_its_run_and_released_by_the_last(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))

    async def reserve():
        return await locks.wait_async(locks.enqueue("s"), 5, 30, 1)

    reserved = asyncio.run(reserve())
    claimed = locks.claim_delegated("s")
    assert claimed is reserved
    assert locks.claim_delegated("s") is None  # one run per reservation
    locks.release(reserved)  # the handler is done first (client went away) ...
    assert queued(locks, "s") == 1  # ... the run still holds the turn
    locks.release(claimed)
    assert queued(locks, "s") == 0


def test_a_nested_turn_on_the_same_thread_is_seen(store: GuardStore) -> None:
    locks = TurnLocks(None)
    held = locks.wait(locks.enqueue("s"), 5, 30, 1)
    assert locks.held_by_thread("s") is held
    locks.release(held)
    assert locks.held_by_thread("s") is None


def test_fresher_history_only_when_state_db_has_messages_the_caller_lacks() -> None:
    a, b = {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}
    c = {"role": "user", "content": "c"}
    assert not fresher_history([a, b], [a, b])
    assert not fresher_history([a, b], None)
    assert not fresher_history([a], [a, b, c])  # the caller has more (not persisted yet)
    assert fresher_history([a, b, c], [a, b])


def test_retry_after_is_bounded() -> None:
    assert retry_after(0) == 1 and retry_after(120) == 30 and retry_after(8) == 2


def test_event_loop_waiters_are_woken_in_arrival_order(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))

    async def main() -> list[int]:
        first = await locks.wait_async(locks.enqueue("s"), 5, 30, 1)
        order: list[int] = []

        async def turn(i: int, ticket) -> None:
            held = await locks.wait_async(ticket, 30, 30, 1)
            order.append(i)
            await asyncio.sleep(0)
            locks.release(held)

        tickets = [locks.enqueue("s") for _ in range(6)]
        tasks = [asyncio.create_task(turn(i, t)) for i, t in reversed(list(enumerate(tickets)))]
        await asyncio.sleep(0.01)
        locks.release(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == list(range(6))


def test_without_a_store_the_queue_is_in_process_only_and_writes_no_table(store: GuardStore,
                                                                          tmp_path: Path) -> None:
    """Native mode's API queue (Hermes holds the lease): arrival order, no turn lease table."""
    db_path = tmp_path / "state.db"
    process_only = turn_locks_for(db_path, None)
    assert process_only is turn_locks_for(db_path, None) and process_only is not turn_locks_for(db_path, store)

    async def main() -> list[int]:
        first = await process_only.wait_async(process_only.enqueue("s"), 5, 30, 1)
        order: list[int] = []

        async def turn(i: int, ticket) -> None:
            held = await process_only.wait_async(ticket, 30, 30, 1)
            order.append(i)
            process_only.release(held)

        tickets = [process_only.enqueue("s") for _ in range(4)]
        tasks = [asyncio.create_task(turn(i, t)) for i, t in reversed(list(enumerate(tickets)))]
        await asyncio.sleep(0.01)
        process_only.release(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == list(range(4))
    with store.reading() as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "session_guard_turn_locks" not in tables


def test_a_compaction_outside_a_turn_holds_a_free_turn_and_turns_arriving_wait(store: GuardStore) -> None:
    locks = TurnLocks(turn_leases(store))
    held = locks.try_hold("s", 30)
    assert held is not None and held.held and locks.held_by_thread("s") is held
    with pytest.raises(TurnBusy):
        locks.wait(locks.enqueue("s"), 0.05, 30, 1)  # a turn arriving meanwhile waits behind it
    waiting = locks.enqueue("s")
    locks.release(held)
    got = locks.wait(waiting, 5, 30, 1)
    assert got.held
    locks.release(got)
    assert queued(locks, "s") == 0


def test_a_compaction_never_waits_for_a_turn_already_running_or_queued(store: GuardStore, tmp_path: Path) -> None:
    locks = TurnLocks(turn_leases(store))
    running = locks.wait(locks.enqueue("s"), 5, 30, 1)
    assert locks.try_hold("s", 30) is None
    assert queued(locks, "s") == 1
    locks.release(running)
    other_store = GuardStore(tmp_path / "state.db")  # another process's turn holds the lease
    other = TurnLocks(turn_leases(other_store))
    elsewhere = other.wait(other.enqueue("s"), 5, 30, 1)
    assert locks.try_hold("s", 30) is None and queued(locks, "s") == 0
    other.release(elsewhere)
    other_store.close()


class _TableOfTheHost:
    """A lease table the host keeps (0.20+'s ``session_turn_leases``): one holder per session."""

    name = "turn"

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return self.rows.setdefault(session_id, holder) == holder

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        return self.rows.get(session_id) == holder

    def release(self, session_id: str, holder: str) -> None:
        if self.rows.get(session_id) == holder:
            del self.rows[session_id]

    def holder(self, session_id: str) -> str | None:
        return self.rows.get(session_id)


def test_an_in_process_queue_holds_the_hosts_lease_for_a_compaction(tmp_path: Path) -> None:
    """Native mode: the queue has no table of its own; the compaction takes the host's turn lease."""
    process_only = turn_locks_for(tmp_path / "native.db", None)
    table = _TableOfTheHost()
    held = process_only.try_hold("s", 30, table)
    assert held is not None and table.holder("s") is not None
    process_only.release(held)
    assert table.rows == {}
    table.rows["s"] = "a turn of the host's"
    assert process_only.try_hold("s", 30, table) is None and queued(process_only, "s") == 0


def test_turn_options_are_validated_by_name() -> None:
    from hermes_session_guard.config import TurnsConfig, parse_config

    assert parse_config(None).turns.wait_seconds == 120.0
    assert parse_config({"turns": {"wait_seconds": 30}}).turns.wait_seconds == 30.0
    for bad, key in (({"wait_seconds": -1}, "turns.wait_seconds"), ({"lease_seconds": 1}, "turns.lease_seconds"),
                     ({"wait_seconds": "long"}, "turns.wait_seconds"), ({"wait": 1}, "turns.wait")):
        cfg = parse_config({"turns": bad})
        assert cfg.turns == TurnsConfig()  # the default is used
        assert [f.key for f in cfg.fallbacks] == [f"session_guard.{key}"]


class _Agent:
    """An agent as the 0.20+ ``turn_history`` seam reads it: id, SessionDB, nothing else."""

    def __init__(self, live: list[dict[str, str]]) -> None:
        self.session_id = "S1"
        self._session_db = self
        self._live = live

    def get_messages_as_conversation(self, sid: str) -> list[dict[str, str]]:
        assert sid == "S1"
        return [dict(m) for m in self._live]


def _turn_history(runtime: Any) -> Any:
    from hermes_session_guard.seams.table import SEAMS
    from hermes_session_guard.seams.turns import live_history_wrapper

    row = next(r for r in SEAMS if r.seam == "turn_history" and r.wrapper is not None)
    return live_history_wrapper(runtime, row)


def test_a_turn_handed_a_stale_history_starts_on_the_live_transcript(runtime: Any) -> None:
    """0.20+: the caller read the history before a compaction it did not wait for in
    Hermes's own admission; the turn gets the live transcript instead."""
    live = [{"role": "user", "content": "[summary]"}, {"role": "assistant", "content": "a2"}]
    stale = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    seen: list[Any] = []
    wrapper = _turn_history(runtime)
    wrapper(lambda *a, **k: seen.append(k["conversation_history"]), _Agent(live), ("hi",),
            {"conversation_history": stale})
    assert [m["content"] for m in seen[0]] == ["[summary]", "a2"]
    seen.clear()
    current = [dict(m) for m in live]  # up to date: passed through as it is
    wrapper(lambda *a, **k: seen.append(k["conversation_history"]), _Agent(live), ("hi",),
            {"conversation_history": current})
    assert seen[0] is current


def test_the_turn_runs_on_its_callers_history_when_the_live_read_fails(runtime: Any,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    class Broken(_Agent):
        def get_messages_as_conversation(self, sid: str) -> list[dict[str, str]]:
            raise RuntimeError("state.db is gone")

    history = [{"role": "user", "content": "u1"}]
    seen: list[Any] = []
    _turn_history(runtime)(lambda *a, **k: seen.append(k["conversation_history"]), Broken([]), ("hi",),
                           {"conversation_history": history})
    assert seen == [history]
    assert any("AIAgent.run_conversation" in r.getMessage() and "failing open" in r.getMessage()
               for r in caplog.records if r.levelname == "ERROR")


class _RowsDb:
    """A SessionDB's loader over rows with ids (``include_row_ids`` stamps ``_row_id``)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def get_messages_as_conversation(self, sid: str, include_row_ids: bool = False) -> list[dict[str, Any]]:
        return [dict(r) if include_row_ids else {k: v for k, v in r.items() if k != "_row_id"} for r in self.rows]


def test_the_turns_own_prompt_written_at_send_is_not_fresher_history() -> None:
    """0.21+'s TUI writes a prompt when it is sent and stages that row on the agent: the
    turn's history lacks it on purpose (Hermes adopts the row), so it is no reason to hand
    the turn the live transcript, which would send and store the prompt twice."""
    from types import SimpleNamespace

    from hermes_session_guard import host

    a, b = {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}
    rows = [{**a, "_row_id": 1}, {**b, "_row_id": 2}, {"role": "user", "content": "now", "_row_id": 3}]
    agent = SimpleNamespace(_session_db=_RowsDb(rows), session_db=_RowsDb(rows),
                            _pending_cli_user_message={"role": "user", "content": "now", "_row_id": 3})
    agent.session_db = agent._session_db
    assert host.staged_turn_row(agent) == 3
    live = host.live_transcript(agent, "s", leave_out_row=host.staged_turn_row(agent))
    assert live == [a, b] and not fresher_history(live, [a, b])
    assert fresher_history(host.live_transcript(agent, "s"), [a, b])  # counted, it would look fresher
    for staged in (None, {"content": "now"}, {"_row_id": True}, "now"):
        assert host.staged_turn_row(SimpleNamespace(_pending_cli_user_message=staged)) is None


def test_turn_and_compression_leases_are_one_implementation_over_two_tables(store: GuardStore) -> None:
    """The turn lease and the compression lease of one session are independent rows (two
    tables), taken, expired (on the injected clock) and taken over the same way."""
    from hermes_session_guard.locks.session_lock import GuardLeases
    from hermes_session_guard.store.schema import TURN_TABLE

    now = [1000.0]
    turns = GuardLeases(store, clock=lambda: now[0], table=TURN_TABLE, name="turn")
    compressions = GuardLeases(store, clock=lambda: now[0])
    assert turns.try_acquire("s", "a", 10) and compressions.try_acquire("s", "b", 10)
    assert (turns.holder("s"), compressions.holder("s")) == ("a", "b")
    assert not turns.try_acquire("s", "c", 10)
    now[0] += 11  # both expired: taken over by the next holder
    assert turns.holder("s") is None and turns.try_acquire("s", "c", 10) and turns.holder("s") == "c"
    assert not compressions.refresh("s", "b", 10)
    with pytest.raises(ValueError, match="session_guard_inbox is not one of the guard's lease tables"):
        store.try_acquire_lease("s", "x", 10, table="session_guard_inbox")
