"""``/v1/responses`` and ``/v1/runs`` naming an existing session, through the real API
server: they take the session's turn on the event loop like the other API routes, so a
request that cannot get it within ``turns.wait_seconds`` is answered 503 ``session_busy``
(nothing written), and a run keeps its turn until the run's own task ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import parse_config
from hermes_session_guard.locks.turn_lock import TurnTicket, turn_locks_for
from hermes_session_guard.seams.table import select_row
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .api_turns import ApiServer, Reply, answer_for, chat_completion, echo_last_user, post, running_api_server
from .conftest import HOST

SID = "20260701_090000_runs01"
_ROW = select_row("api_runs_turns", HOST)
pytestmark = pytest.mark.skipif(
    _ROW is None or _ROW.wrapper is None,
    reason=f"Hermes {'.'.join(map(str, HOST))} orders its API turns itself: {_ROW.note if _ROW else ''}")


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        yield srv


@pytest.fixture
def held(guard: Any, db: Any) -> Iterator[Any]:
    """The session's turn, held by this test (as a long turn of another entry point would)."""
    path = Path(db.db_path)
    locks = turn_locks_for(path, guard.store_for(path))
    ticket = locks.wait(locks.enqueue(SID), 5, 60, 1)
    box: dict[str, TurnTicket | None] = {"ticket": ticket}

    def release() -> None:
        if box["ticket"] is not None:
            locks.release(box["ticket"])
            box["ticket"] = None

    try:
        yield release
    finally:
        release()


def _responses(srv: ApiServer, text: str, previous: str | None = None) -> Reply:
    payload: dict[str, Any] = {"model": "fake-model", "input": text}
    if previous:
        payload["previous_response_id"] = previous
    return post(srv.base + "/v1/responses", payload)


def _run(srv: ApiServer, text: str, sid: str = SID) -> Reply:
    return post(srv.base + "/v1/runs", {"model": "fake-model", "input": text, "session_id": sid})


def _run_finished(srv: ApiServer, run_id: str) -> dict[str, Any]:
    for _ in range(1200):  # a bound on the loop, not on the run's duration
        status = dict(srv.adapter._run_statuses.get(run_id) or {})
        if status.get("status") in ("completed", "failed", "cancelled", "stopped"):
            return status
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish")


def _refused(reply: Reply, sid: str) -> None:
    assert reply.status == 503, (reply.status, reply.body)
    assert reply.body["error"]["code"] == "session_busy" and reply.body["error"]["session_id"] == sid
    assert reply.retry_after is not None and int(reply.retry_after) >= 1


@pytest.fixture
def short_wait(guard: Any) -> Iterator[None]:
    before = guard.config
    guard.config = parse_config({"turns": {"wait_seconds": 0.5}})
    yield
    guard.config = before


def test_responses_continuing_a_busy_session_are_refused_with_503(guard: Any, db: Any, llm: FakeLLMServer,
                                                                  server: ApiServer, short_wait: None) -> None:
    llm.configure(reply_fn=echo_last_user)
    first = _responses(server, "first")
    assert first.status == 200, first.body
    stored = server.adapter._response_store.get(first.body["id"])
    sid = stored["session_id"]
    path = Path(db.db_path)
    locks = turn_locks_for(path, guard.store_for(path))
    ticket = locks.wait(locks.enqueue(sid), 5, 60, 1)
    try:
        refused = _responses(server, "msg-refused-resp", previous=first.body["id"])
    finally:
        locks.release(ticket)
    _refused(refused, sid)
    assert not any("msg-refused-resp" in str(r.body) for r in llm.chat_requests())
    after = _responses(server, "third", previous=first.body["id"])  # the turn is free again
    assert after.status == 200


def test_a_run_naming_a_busy_session_is_refused_with_503(guard: Any, db: Any, llm: FakeLLMServer, server: ApiServer,
                                                         short_wait: None, held: Any) -> None:
    probe.seed_session(db, SID, probe.seed_messages(2, chars=40), source="api_server")
    llm.configure(reply_fn=echo_last_user)
    refused = _run(server, "msg-refused-run")
    held()
    _refused(refused, SID)
    assert not server.adapter._active_run_tasks
    assert not any("msg-refused-run" in str(r.body) for r in llm.chat_requests())
    assert "msg-refused-run" not in [str(m.get("content")) for m in db.get_messages_as_conversation(SID)]


def test_a_run_keeps_its_turn_until_its_task_ends(guard: Any, db: Any, llm: FakeLLMServer, server: ApiServer,
                                                  held: Any) -> None:
    """Accepted once the turn before it ended; a chat completion sent right after the 202 is
    answered after the run's turn, not in the gap before the run's worker starts."""
    probe.seed_session(db, SID, probe.seed_messages(2, chars=40), source="api_server")
    llm.configure(reply_fn=echo_last_user, latency=0.3)
    replies: dict[str, Reply] = {}
    sender = threading.Thread(target=lambda: replies.__setitem__("run", _run(server, "run-msg")), daemon=True)
    sender.start()
    sender.join(0.5)
    assert sender.is_alive(), "the run was accepted while the session's turn was held"
    held()
    sender.join(60)
    accepted = replies["run"]
    assert accepted.status == 202, accepted.body
    chat = chat_completion(server, SID, "chat-msg")
    status = _run_finished(server, accepted.body["run_id"])
    assert status["status"] == "completed" and chat.status == 200
    live = [(m.get("role"), str(m.get("content"))) for m in db.get_messages_as_conversation(SID)]
    assert live[-4:] == [("user", "run-msg"), ("assistant", answer_for("run-msg")),
                         ("user", "chat-msg"), ("assistant", answer_for("chat-msg"))]
