"""The inbox: durable FIFO per session, exactly-once state changes (no Hermes needed)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import BufferConfig, parse_config
from hermes_session_guard.contract.compressing import CompressingSessions
from hermes_session_guard.inbox.repository import BUFFERED, DELIVERED, DISPATCHED, FAILED, Inbox, InboxEntry, InboxFull
from hermes_session_guard.store import GuardStore

from .inbox_steps import dispatch_next


@pytest.fixture
def store(tmp_path: Path) -> Iterator[GuardStore]:
    s = GuardStore(tmp_path / "state.db")
    yield s
    s.close()


def _append(inbox: Inbox, key: str, text: str, op: str = "op1", max_messages: int = 0) -> InboxEntry:
    return inbox.append(session_key=key, session_id="S", op_id=op, payload={"text": text}, text=text,
                        max_messages=max_messages)


def test_messages_keep_arrival_order_and_positions_per_operation(store: GuardStore) -> None:
    inbox = Inbox(store)
    for k in range(3):
        _append(inbox, "chat-a", f"a{k}")
    _append(inbox, "chat-b", "b0")
    _append(inbox, "chat-a", "a3", op="op2")
    a = inbox.entries("chat-a")
    assert [(e.text, e.position, e.op_id, e.state) for e in a] == [
        ("a0", 1, "op1", BUFFERED), ("a1", 2, "op1", BUFFERED), ("a2", 3, "op1", BUFFERED),
        ("a3", 1, "op2", BUFFERED),
    ]
    assert [e.seq for e in a] == sorted(e.seq for e in a)
    assert inbox.undelivered_keys() == ["chat-a", "chat-b"]
    assert inbox.latest_op("chat-a") == "op2"
    assert a[0].payload == {"text": "a0"}


def test_buffered_messages_survive_a_new_connection(tmp_path: Path) -> None:
    first = GuardStore(tmp_path / "state.db")
    _append(Inbox(first), "chat", "kept")
    first.close()
    again = GuardStore(tmp_path / "state.db")
    try:
        assert [e.text for e in Inbox(again).entries("chat", states=(BUFFERED,))] == ["kept"]
    finally:
        again.close()


def test_dispatch_then_settle_delivers_each_message_once(store: GuardStore) -> None:
    inbox = Inbox(store)
    for k in range(3):
        _append(inbox, "chat", f"m{k}")
    settled, first = inbox.settle_and_dispatch("chat", "runner-1")
    assert settled == [] and first is not None and first.text == "m0"
    settled, second = inbox.settle_and_dispatch("chat", "runner-1")
    assert [e.text for e in settled] == ["m0"] and second is not None and second.text == "m1"
    # settling again does not deliver m0 a second time
    settled, _ = inbox.settle_and_dispatch("chat", "runner-1", dispatch=False)
    assert [e.text for e in settled] == ["m1"]
    settled, third = inbox.settle_and_dispatch("chat", "runner-1")
    assert settled == [] and third is not None and third.text == "m2"
    states = {e.text: e.state for e in inbox.entries("chat")}
    assert states == {"m0": DELIVERED, "m1": DELIVERED, "m2": DISPATCHED}


def test_settle_leaves_other_runners_and_kept_messages_alone(store: GuardStore) -> None:
    inbox = Inbox(store)
    for k in range(3):
        _append(inbox, "chat", f"m{k}")
    mine = dispatch_next(inbox, "chat", "me")
    theirs = dispatch_next(inbox, "chat", "dead-runner")
    handed = dispatch_next(inbox, "chat", "me")
    assert mine and theirs and handed
    settled, _ = inbox.settle_and_dispatch("chat", "me", keep={handed.seq}, dispatch=False)
    assert [e.text for e in settled] == ["m0"]
    states = {e.text: (e.state, e.owner) for e in inbox.entries("chat")}
    assert states == {"m0": (DELIVERED, "me"), "m1": (DISPATCHED, "dead-runner"), "m2": (DISPATCHED, "me")}


def test_requeued_message_keeps_its_place(store: GuardStore) -> None:
    inbox = Inbox(store)
    for k in range(3):
        _append(inbox, "chat", f"m{k}")
    first = dispatch_next(inbox, "chat", "dead")
    assert first is not None and inbox.requeue(first.seq)
    assert not inbox.requeue(first.seq)  # already back in the queue
    again = dispatch_next(inbox, "chat", "me")
    assert again is not None and again.text == "m0"


def test_cap_refuses_instead_of_dropping(store: GuardStore) -> None:
    inbox = Inbox(store)
    _append(inbox, "chat", "m0", max_messages=2)
    _append(inbox, "chat", "m1", max_messages=2)
    with pytest.raises(InboxFull) as full:
        _append(inbox, "chat", "m2", max_messages=2)
    assert (full.value.waiting, full.value.limit) == (2, 2)
    _append(inbox, "other", "x", max_messages=2)  # the cap is per session
    inbox.settle_and_dispatch("chat", "me")
    inbox.settle_and_dispatch("chat", "me", dispatch=False)  # m0 delivered: room again
    _append(inbox, "chat", "m2", max_messages=2)
    assert [e.text for e in inbox.entries("chat")] == ["m0", "m1", "m2"]


def test_mark_delivered_and_fail(store: GuardStore) -> None:
    inbox = Inbox(store)
    a = _append(inbox, "chat", "a")
    b = _append(inbox, "chat", "b")
    assert inbox.mark_delivered([a.seq]) == 1
    assert inbox.mark_delivered([a.seq]) == 0
    inbox.fail(b.seq)
    assert [e.state for e in inbox.entries("chat")] == [DELIVERED, FAILED]
    assert not inbox.has_undelivered("chat")


def test_concurrent_appends_from_threads_get_distinct_positions(store: GuardStore) -> None:
    inbox = Inbox(store)
    threads = [threading.Thread(target=_append, args=(inbox, "chat", f"t{k}")) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = inbox.entries("chat")
    assert sorted(e.position for e in entries) == list(range(1, 21))
    assert [e.position for e in entries] == list(range(1, 21))  # seq order == position order


def test_compression_in_flight_from_the_durable_row(store: GuardStore) -> None:
    store.begin_compression("op9", "S", 48)
    assert store.compression_in_flight("S", max_age=300) == "op9"
    assert store.compression_in_flight("other", max_age=300) is None
    assert store.compression_in_flight("S", max_age=-1) is None  # older than the lease
    store.set_compression_phase("op9", "done", finished=True)
    assert store.compression_in_flight("S", max_age=300) is None


def test_compressing_sessions_registry() -> None:
    reg = CompressingSessions()
    assert reg.op_for("S") is None and reg.op_for(None) is None
    reg.begin("S", "op1")
    reg.begin("S", "op2")
    assert reg.op_for("S") == "op1"
    reg.end("S", "op1")
    assert reg.op_for("S") == "op2"
    reg.end("S", "op2")
    reg.end("S", "op2")
    assert reg.op_for("S") is None and reg.sessions() == []


def test_buffer_options_are_validated() -> None:
    cfg = parse_config({"buffer": {"max_messages": 5, "receipt": False, "overflow_text": "full ({waiting}/{limit})"}})
    assert (cfg.buffer.max_messages, cfg.buffer.receipt, cfg.buffer.enabled) == (5, False, True)
    for bad, key in (({"max_messages": -1}, "max_messages"), ({"overflow_text": "full {count}"}, "overflow_text"),
                     ({"enabled": "yes"}, "enabled")):
        cfg = parse_config({"buffer": bad})
        assert cfg.buffer == BufferConfig()  # the default is used
        assert [f.key for f in cfg.fallbacks] == [f"session_guard.buffer.{key}"]


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_the_append_commit_waits_for_the_disk_and_later_changes_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal: str
) -> None:
    """The receipt promises the message is on disk: its commit runs at synchronous=FULL
    whatever the connection's own level (in WAL, NORMAL except on macOS); in WAL the later
    state changes run at NORMAL; the connection goes back to its own level after each. In
    the rollback journal Hermes 0.20+ chooses where WAL is unsafe, every commit is FULL."""
    import sqlite3

    with closing(sqlite3.connect(tmp_path / "state.db")) as conn:  # the mode Hermes gave state.db
        conn.execute(f"PRAGMA journal_mode={journal}")
    store = GuardStore(tmp_path / "state.db")
    levels: list[int] = []
    real = store.transaction

    @contextmanager
    def spy(**kwargs: Any) -> Iterator[Any]:
        with real(**kwargs) as conn:
            levels.append(conn.execute("PRAGMA synchronous").fetchone()[0])
            yield conn

    monkeypatch.setattr(store, "transaction", spy)
    inbox = Inbox(store)
    _append(inbox, "chat-a", "a0")
    head = dispatch_next(inbox, "chat-a", "runner")
    assert head is not None
    inbox.settle_and_dispatch("chat-a", "runner")
    store.begin_compression("op", "S", 3)  # neither: the connection's own level
    with store.reading() as conn:
        own = conn.execute("PRAGMA synchronous").fetchone()[0]
    store.close()
    if journal == "delete":
        assert own == 2 and levels == [2, 2, 2, 2]
        return
    assert own == (2 if sys.platform == "darwin" else 1)
    assert levels == [2, 1, 1, own]
