"""Concurrent turns on one session through the real API server: answered one by one, in
arrival order, through a compression (held summary call), with nothing merged, stale or lost."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import parse_config
from hermes_session_guard.seams.table import select_row
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .api_turns import (
    ApiServer,
    chat_completion,
    contract_violations,
    echo_last_user,
    marker,
    running_api_server,
    send_staggered,
    session_chat,
)
from .conftest import HOST, HOST_NATIVE_MODE

SID = "20260701_090000_turns1"
HEAD = "turn-0:"
_CHAT_ROW = select_row("api_session_chat_turns", HOST)
_TURN_ROW = select_row("turn_order", HOST)
# 0.20+: Hermes's own durable turn lease orders the agent's turns (TUI, ACP, processes); the
# guard's turn_order rows are not-needed there (they name the lease they rely on).
HERMES_ORDERS_TURNS = _TURN_ROW is not None and not _TURN_ROW.patches and bool(_TURN_ROW.requires)
# the session chat endpoints exist from 0.15; the guard queues requests in front of every API
# handler (0.20+: in-process only, the turn then takes Hermes's own session_turn_leases)
HAS_SESSION_CHAT = _CHAT_ROW is not None and _CHAT_ROW.wrapper is not None
# 0.19+ refuses a request past gateway.api_server.max_concurrent_runs (default 10) with 429 (on
# 0.20.1 /v1/chat/completions only, on 0.22 every endpoint); a request waiting for its session's
# turn must not take one of those slots. A cap of 2 lets a 3-message burst cross it.
RUN_CAP = 2
# A Hermes 0.20+ turn costs seconds of agent setup: there the first endpoint's non-streaming
# cases run in CI, the rest (same queue, other endpoints/streaming/20 messages) are ``slow``.
NATIVE_SLOW = [pytest.mark.slow] if HOST_NATIVE_MODE else []


@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        if hasattr(srv.adapter, "_max_concurrent_runs"):
            srv.adapter._max_concurrent_runs = RUN_CAP
        yield srv


@pytest.fixture
def gate(llm: FakeLLMServer) -> Iterator[threading.Event]:
    event = threading.Event()
    llm.configure(summary_gate=event, reply_fn=echo_last_user)
    yield event
    event.set()


def _seeded(db: Any, sid: str = SID) -> None:
    probe.seed_session(db, sid, probe.seed_messages(), source="api_server")


def _burst_during_compression(srv: ApiServer, llm: FakeLLMServer, gate: threading.Event, send: Any,
                              n: int) -> tuple[list[str], dict[str, Any]]:
    """m0 triggers the compression; while its summary call is held, ``n`` more arrive."""
    sent = [marker(i) for i in range(n + 1)]
    first_threads, replies = send_staggered(send, sent[:1], gap=0)
    assert llm.summary_started.wait(60), "the first turn never reached the summary call"
    threads, more = send_staggered(send, sent[1:])
    for t in threads:
        t.join(0.2)  # all of them are in flight, waiting
    gate.set()
    for t in first_threads + threads:
        t.join(180)
    replies.update(more)
    return sent, replies


def _endpoint(name: str, srv: ApiServer, stream: bool = False) -> Any:
    fn = session_chat if name == "session_chat" else chat_completion
    return lambda text: fn(srv, SID, text, stream=stream)


# /api/sessions/{id}/chat[/stream] from 0.15; /v1/chat/completions + X-Hermes-Session-Id on every release
_NAMES = (["session_chat"] if HAS_SESSION_CHAT else []) + ["chat_completions"]
ENDPOINTS = [pytest.param(name, marks=NATIVE_SLOW if i else []) for i, name in enumerate(_NAMES)]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("n,stream", [(3, False), pytest.param(3, True, marks=NATIVE_SLOW),
                                      pytest.param(20, False, marks=NATIVE_SLOW)])
def test_burst_during_compression_is_answered_in_order(guard: Any, db: Any, llm: FakeLLMServer, server: ApiServer,
                                                       gate: threading.Event, endpoint: str, n: int,
                                                       stream: bool) -> None:
    if n == 20 and endpoint != _NAMES[0]:
        pytest.skip("the 20-message burst runs once per release, through its first endpoint")
    _seeded(db)
    sent, replies = _burst_during_compression(server, llm, gate, _endpoint(endpoint, server, stream), n)
    assert contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD) == []
    assert len(llm.summary_requests()) == 1


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_burst_without_compression_runs_one_at_a_time(guard: Any, db: Any, llm: FakeLLMServer,
                                                       server: ApiServer, endpoint: str) -> None:
    probe.seed_session(db, SID, probe.seed_messages(4, chars=40), source="api_server")
    llm.configure(reply_fn=echo_last_user, latency=0.2)
    sent = [marker(i, "plain") for i in range(6)]
    threads, replies = send_staggered(_endpoint(endpoint, server), sent)
    for t in threads:
        t.join(120)
    assert contract_violations(db, SID, sent, replies, llm, compressed=False) == []


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_over_the_wait_bound_is_refused_with_retry_after_and_nothing_written(
        guard: Any, db: Any, llm: FakeLLMServer, server: ApiServer, gate: threading.Event, endpoint: str) -> None:
    _seeded(db)
    before = guard.config
    guard.config = parse_config({"turns": {"wait_seconds": 0.5}})
    send = _endpoint(endpoint, server)
    try:
        first, replies = send_staggered(send, [marker(0)], gap=0)
        assert llm.summary_started.wait(60)
        refused = send(marker(1))
        gate.set()
        first[0].join(180)
    finally:
        guard.config = before
    assert refused.status == 503
    assert refused.retry_after is not None and int(refused.retry_after) >= 1
    assert SID in refused.body["error"]["message"] and refused.body["error"]["session_id"] == SID
    assert refused.session_header == SID
    assert replies[marker(0)].status == 200
    live = [str(m.get("content")) for m in db.get_messages_as_conversation(SID)]
    assert marker(1) not in live and marker(0) in live
    assert not any(marker(1) in str(r.body) for r in llm.chat_requests())


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_without_the_guard_the_burst_breaks_the_contract(no_guard: None, db: Any, llm: FakeLLMServer,
                                                         server: ApiServer, gate: threading.Event,
                                                         endpoint: str) -> None:
    """The reproduction: the host alone answers the waiting turns from the pre-compression
    transcript (or merges, reorders, loses them, refuses them past its run cap, or moves the
    session to a new id). In native mode Hermes keeps the id and the transcript, and what
    breaks is arrival order: each waiting turn polls Hermes's lease once a second, so which
    one goes next is chance. Six waiting turns keep the chance of arrival order at 1/720
    (three, at 1/6, met it by luck on a loaded machine)."""
    _seeded(db)
    waiting = 6 if HOST_NATIVE_MODE else 3
    sent, replies = _burst_during_compression(server, llm, gate, _endpoint(endpoint, server), waiting)
    assert contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD) != []
