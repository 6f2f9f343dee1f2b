"""Which busy messages the guard buffers and which it leaves to Hermes (fake gateway objects)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.config import GuardConfig
from hermes_session_guard.inbox.repository import BUFFERED, DISPATCHED, Inbox
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seams import buffering

from .inbox_steps import dispatch_next

KEY = "agent:main:telegram:dm:42"


@dataclass
class Source:
    chat_id: str = "42"
    user_id: str = "u1"
    platform: Any = "telegram"

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "chat_id": self.chat_id, "user_id": self.user_id}


@dataclass
class Event:
    text: str
    source: Source = field(default_factory=Source)
    message_id: str = "7"
    internal: bool = False


class Adapter:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self._pending_messages: dict[str, Any] = {}
        self._active_sessions: dict[str, Any] = {KEY: object()}

    async def _send_with_retry(self, chat_id: str, content: str, reply_to: Any = None, metadata: Any = None) -> Any:
        self.sent.append(content)
        return SimpleNamespace(success=True)


class Runner:
    def __init__(self, db: Path, sid: str = "S1") -> None:
        self.adapter = Adapter()
        self.adapters = {"telegram": self.adapter}
        self.session_store = SimpleNamespace(_entries={KEY: SimpleNamespace(session_id=sid)})
        self._running_agents: dict[str, Any] = {KEY: SimpleNamespace(session_id=sid)}
        self._session_db = SimpleNamespace(db_path=db)
        self._draining = False
        self.authorized = True

    def _is_user_authorized(self, source: Any) -> bool:
        return self.authorized

    def _session_key_for_source(self, source: Any) -> str:
        return KEY

    def _reply_anchor_for_event(self, event: Any) -> Any:
        return event.message_id

    def _thread_metadata_for_source(self, source: Any, anchor: Any) -> Any:
        return None


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    rt = Runtime(config=GuardConfig(), host_version="0.19.0", fixed_home=tmp_path)
    yield rt
    rt.close()


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path / "state.db")


def busy(runtime: Runtime, runner: Runner, event: Event) -> tuple[bool, list[str]]:
    """Run the busy-message rule; return (handled, what reached Hermes)."""
    to_host: list[str] = []

    async def call_host() -> bool:
        to_host.append(event.text)
        return False

    handled = asyncio.run(buffering.on_busy_message(runtime, runner, event, KEY, call_host))
    return handled, to_host


def inbox(runtime: Runtime, runner: Runner) -> Inbox:
    return buffering.inbox_for(runtime, runner)


def test_while_compressing_a_message_is_buffered_and_receipted(runtime: Runtime, runner: Runner) -> None:
    runtime.compressing.begin("S1", "op1")
    assert busy(runtime, runner, Event("hello")) == (True, [])
    (entry,) = inbox(runtime, runner).entries(KEY)
    assert (entry.text, entry.op_id, entry.position, entry.state, entry.session_id) == ("hello", "op1", 1, BUFFERED,
                                                                                        "S1")
    assert runner.adapter.sent == [GuardConfig().buffer.receipt_text]


def test_not_compressing_and_nothing_buffered_goes_to_hermes(runtime: Runtime, runner: Runner) -> None:
    assert busy(runtime, runner, Event("hello")) == (False, ["hello"])
    assert inbox(runtime, runner).entries() == []


def test_after_compression_later_messages_queue_behind_buffered_ones(runtime: Runtime, runner: Runner) -> None:
    runtime.compressing.begin("S1", "op1")
    busy(runtime, runner, Event("first"))
    runtime.compressing.end("S1", "op1")
    assert busy(runtime, runner, Event("second")) == (True, [])
    assert [(e.text, e.op_id, e.position) for e in inbox(runtime, runner).entries(KEY)] == [
        ("first", "op1", 1), ("second", "op1", 2)]


def test_answer_to_a_pending_approval_is_not_held_behind_the_buffer(
    runtime: Runtime, runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime.compressing.begin("S1", "op1")
    busy(runtime, runner, Event("first"))
    runtime.compressing.end("S1", "op1")
    monkeypatch.setattr(host, "approval_pending", lambda key: True)
    assert busy(runtime, runner, Event("yes")) == (False, ["yes"])


@pytest.mark.parametrize("case", ["command", "internal", "unauthorized", "draining", "disabled"])
def test_messages_hermes_must_see_pass_through_even_while_compressing(
    runtime: Runtime, runner: Runner, case: str
) -> None:
    runtime.compressing.begin("S1", "op1")
    event = Event("/status" if case == "command" else "hello", internal=case == "internal")
    runner.authorized = case != "unauthorized"
    runner._draining = case == "draining"
    if case == "disabled":
        runtime.config = GuardConfig(buffer=type(runtime.config.buffer)(enabled=False))
    handled, to_host = busy(runtime, runner, event)
    assert to_host == [event.text] and inbox(runtime, runner).entries() == []


def test_compression_recorded_by_another_process_counts(runtime: Runtime, runner: Runner) -> None:
    inbox(runtime, runner).store.begin_compression("op-elsewhere", "S1", 48)
    assert busy(runtime, runner, Event("hello")) == (True, [])
    assert inbox(runtime, runner).entries(KEY)[0].op_id == "op-elsewhere"


def test_compression_lease_held_by_another_process_counts(runtime: Runtime, runner: Runner) -> None:
    """0.14: the guard's own lease table; the holder names the compression's op."""
    store = inbox(runtime, runner).store
    assert store.try_acquire_lease("S1", "pid=1:tid=2:guard-op=op-leased:nonce=abc", 300.0)
    assert busy(runtime, runner, Event("hello")) == (True, [])
    assert inbox(runtime, runner).entries(KEY)[0].op_id == "op-leased"
    store.release_lease("S1", "pid=1:tid=2:guard-op=op-leased:nonce=abc")


def test_expired_lease_does_not_count(runtime: Runtime, runner: Runner) -> None:
    store = inbox(runtime, runner).store
    assert store.try_acquire_lease("S1", "pid=1:tid=2:guard-op=dead:nonce=abc", 60.0, now=time.time() - 3600)
    assert busy(runtime, runner, Event("hello")) == (False, ["hello"])


@pytest.mark.parametrize("holder, op", [("pid=1:tid=2:guard-op=op-native:nonce=x", "op-native"),
                                        ("hermes-pid-9", "hermes-pid-9")])
def test_hermes_compression_lock_held_counts(runtime: Runtime, runner: Runner, holder: str, op: str) -> None:
    """0.18.2+: Hermes's compression_locks (held by the guard for a whole compression,
    or by Hermes itself), read through the runner's SessionDB as the gateway reads it."""
    asked: list[str] = []

    def get_compression_lock_holder(sid: str) -> str | None:
        asked.append(sid)
        return holder if sid == "S1" else None

    runner._session_db.get_compression_lock_holder = get_compression_lock_holder  # type: ignore[attr-defined]
    assert busy(runtime, runner, Event("hello")) == (True, [])
    assert inbox(runtime, runner).entries(KEY)[0].op_id == op and "S1" in asked


def test_store_failure_fails_open(runtime: Runtime, runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime.compressing.begin("S1", "op1")

    def broken(*a: Any, **k: Any) -> Any:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Inbox, "append", broken)
    assert busy(runtime, runner, Event("hello")) == (False, ["hello"])
    assert runner.adapter.sent == []


def test_a_stored_message_never_also_goes_to_hermes(
    runtime: Runtime, runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the row is committed, a later failure (its audit event) leaves it buffered
    and receipted, and Hermes does not get it a second time."""
    runtime.compressing.begin("S1", "op1")

    class BrokenAudit:
        def info(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("audit sink broken")

    monkeypatch.setattr(runtime.audit, "operation", lambda *a, **k: BrokenAudit())
    assert busy(runtime, runner, Event("hello")) == (True, [])
    assert [e.text for e in inbox(runtime, runner).entries(KEY)] == ["hello"]
    assert runner.adapter.sent == [GuardConfig().buffer.receipt_text]


def test_replayed_message_finding_its_session_busy_goes_back_in_line(runtime: Runtime, runner: Runner) -> None:
    runtime.compressing.begin("S1", "op1")
    busy(runtime, runner, Event("a"))
    busy(runtime, runner, Event("b"))
    owner = buffering.runner_state(runner).owner
    head = dispatch_next(inbox(runtime, runner), KEY, owner)
    assert head is not None
    replayed = Event("a")
    setattr(replayed, host.INBOX_TAG, head.seq)
    assert busy(runtime, runner, replayed) == (True, [])
    assert [(e.text, e.state) for e in inbox(runtime, runner).entries(KEY)] == [("a", BUFFERED), ("b", BUFFERED)]


def test_drain_settles_finished_turns_and_hands_out_the_next(
    runtime: Runtime, runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host, "event_from_payload", lambda payload, seq=None: ("event", payload["text"], seq))
    runtime.compressing.begin("S1", "op1")
    busy(runtime, runner, Event("a"))
    busy(runtime, runner, Event("b"))
    runtime.compressing.end("S1", "op1")
    host_queued = object()
    assert buffering.on_drain(runtime, runner, KEY, host_queued) is host_queued  # Hermes's own item first
    first = buffering.on_drain(runtime, runner, KEY, None)
    assert first[:2] == ("event", "a")
    assert [e.state for e in inbox(runtime, runner).entries(KEY)] == [DISPATCHED, BUFFERED]
    second = buffering.on_drain(runtime, runner, KEY, None)
    assert second[:2] == ("event", "b")
    assert buffering.on_drain(runtime, runner, KEY, None) is None
    assert [e.state for e in inbox(runtime, runner).entries(KEY)] == ["delivered", "delivered"]


class AsyncDoor:
    """What Hermes 0.19's gateway holds as ``_session_db``: every method returns a coroutine."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._db, name)
        if not callable(attr):
            return attr

        async def offloaded(*args: Any, **kwargs: Any) -> Any:
            return attr(*args, **kwargs)

        return offloaded


def test_replay_settles_a_message_its_dead_runner_already_wrote_behind_an_async_session_db(
    runtime: Runtime, runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway killed inside the turn of a buffered message: a new runner finds that
    message in the transcript (read through 0.19's AsyncSessionDB) and replays only the rest."""
    monkeypatch.setattr(host, "event_from_payload", lambda payload, seq=None: ("event", payload["text"], seq))
    replayed: list[Any] = []
    monkeypatch.setattr(host, "redeliver", lambda runner, adapter, event: replayed.append(event))
    runtime.compressing.begin("S1", "op1")
    busy(runtime, runner, Event("a"))
    busy(runtime, runner, Event("b"))
    runtime.compressing.end("S1", "op1")
    assert dispatch_next(inbox(runtime, runner), KEY, "dead-runner") is not None
    written = [{"role": "user", "content": "a", "timestamp": time.time()}]
    runner._session_db = AsyncDoor(SimpleNamespace(db_path=runner._session_db.db_path,
                                                   get_messages=lambda sid: written if sid == "S1" else []))
    restarted = Runner(runner._session_db.db_path)
    restarted._session_db = runner._session_db
    restarted._running_agents = {}
    restarted.adapter._active_sessions = {}

    assert buffering.replay(runtime, restarted) == 1
    assert [e[1] for e in replayed] == ["b"]
    assert [(e.text, e.state) for e in inbox(runtime, restarted).entries(KEY)] == [("a", "delivered"),
                                                                                  ("b", DISPATCHED)]
    assert host.runner_session_db(restarted) is restarted._session_db._db
