"""The TUI gateway and ACP take their turn on an existing session like every other entry
point: a turn they start while an API-server turn of the same session compresses (summary
held) waits for it and answers from the compacted transcript, never from the history they
read when they resumed the session. Cron never runs a turn on an existing session."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.summaries.tags import is_summary_text

from .api_turns import (
    ApiServer,
    Reply,
    chat_completion,
    contract_violations,
    echo_last_user,
    marker,
    running_api_server,
    send_staggered,
    session_chat,
)
from .conftest import DEFERS_TO_USAGE
from .test_turn_order_api import HAS_SESSION_CHAT, HERMES_ORDERS_TURNS
from .tui_import import tui_resume
from .waiting import TURN_WAITS, parked_in, wait_for

SID = "20260701_130000_entry"
# Hermes 0.21+'s TUI writes a prompt when it is sent (upstream #111868), so a prompt sent
# while another turn runs sits before that turn's answer, compaction or not (api_turns.answer_order).
TUI_STORES_AT_SEND = DEFERS_TO_USAGE
HEAD = "turn-0:"
WAIT = 180


# -- TUI gateway: tui_gateway.server's JSON-RPC handlers, as its stdio/WebSocket transport calls them


# -- ACP: acp_adapter.server.HermesACPAgent.prompt, as the ACP JSON-RPC connection calls it


class _AcpClient:
    """The client side of an ACP connection: keeps the agent's message chunks."""

    def __init__(self) -> None:
        self.chunks: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        content = getattr(update, "content", None)
        if getattr(update, "session_update", "") == "agent_message_chunk" and content is not None:
            self.chunks.append(str(getattr(content, "text", "") or ""))

    def __getattr__(self, name: str) -> Any:  # any other client callback: accepted, nothing to do
        async def ignore(*args: Any, **kwargs: Any) -> None:
            return None
        return ignore


def _acp_resume(home: Path) -> Callable[[str], Reply]:
    try:
        from acp.schema import TextContentBlock
        from acp_adapter.server import HermesACPAgent
        from acp_adapter.session import SessionManager
    except ImportError as exc:
        pytest.skip(f"ACP is not importable on this release ({exc})")
    agent = HermesACPAgent(SessionManager(db=probe.open_db(home / "state.db")))
    client = _AcpClient()
    agent.on_connect(client)
    state = agent.session_manager.get_session(SID)  # restores the stored session, reading its history now
    assert state is not None and len(state.history) == len(probe.seed_messages())

    def send(text: str) -> Reply:
        response = asyncio.run(agent.prompt(prompt=[TextContentBlock(type="text", text=text)], session_id=SID))
        assert response.stop_reason == "end_turn", response
        return Reply("".join(client.chunks).strip(), 200, SID, None)

    return send


# -- the scenario



@pytest.fixture
def server(home: Path) -> Iterator[ApiServer]:
    with running_api_server(home) as srv:
        yield srv


def _during_compression(llm: FakeLLMServer, srv: ApiServer, entry: Callable[[str], Reply],
                        tag: str, *, waits: bool = True) -> tuple[list[str], dict[str, Reply]]:
    """An API-server turn compresses (summary held); meanwhile ``entry`` runs a turn."""
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    api = session_chat if HAS_SESSION_CHAT else chat_completion
    sent = [marker(0, "api"), marker(1, tag)]
    try:
        first, replies = send_staggered(lambda t: api(srv, SID, t), sent[:1], gap=0)
        assert llm.summary_started.wait(60), "the API turn never reached the summary call"
        second, more = send_staggered(entry, sent[1:], gap=0)
        # ordered, the entry's turn parks until the compressing turn ends; unordered, it runs on
        # the history it read: to its answer, or to a compression of its own (held like the first)
        assert wait_for(lambda: parked_in(TURN_WAITS) or not second[0].is_alive()
                        or len(llm.summary_requests()) > 1, timeout=60), f"the {tag} turn neither waited nor ran"
        assert second[0].is_alive() or not waits, f"the {tag} turn did not wait for the compressing turn"
    finally:
        gate.set()
    for t in first + second:
        t.join(WAIT)
    replies.update(more)
    return sent, replies


def test_a_tui_turn_waits_for_an_api_turns_compression(guard: Any, db: Any, llm: FakeLLMServer,
                                                        server: ApiServer, tui: Any) -> None:
    probe.seed_session(db, SID, probe.seed_messages(), source="tui")
    tui_server, frames = tui
    sent, replies = _during_compression(llm, server, tui_resume(tui_server, frames, SID), "tui")
    assert contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD,
                               stored_at_send=sent[1:] if TUI_STORES_AT_SEND else ()) == []
    assert len(llm.summary_requests()) == 1


def test_an_acp_turn_waits_for_an_api_turns_compression(guard: Any, home: Path, db: Any, llm: FakeLLMServer,
                                                         server: ApiServer) -> None:
    probe.seed_session(db, SID, probe.seed_messages(), source="acp")  # ACP restores only its own sessions
    sent, replies = _during_compression(llm, server, _acp_resume(home), "acp")
    assert contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD) == []
    assert len(llm.summary_requests()) == 1


def test_without_the_guard_a_tui_turn_answers_from_stale_history(no_guard: None, home: Path, db: Any,
                                                                       llm: FakeLLMServer, server: ApiServer,
                                                                       tui: Any) -> None:
    """The reproduction: the host alone runs the TUI's (and ACP's) turn on the history it
    read at resume (answered from the pre-compression transcript, then lost from it).
    Hermes 0.20+ keeps the promise itself (the seam table's turn rows are not-needed there):
    its turn lease makes the TUI turn wait and reload the live transcript."""
    probe.seed_session(db, SID, probe.seed_messages(), source="tui")
    sent, replies = _during_compression(llm, server, tui_resume(*tui, SID), "tui", waits=HERMES_ORDERS_TURNS)
    violations = contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD,
                                     stored_at_send=sent[1:] if TUI_STORES_AT_SEND else ())
    assert violations == [] if HERMES_ORDERS_TURNS else violations != []


def test_without_the_guard_an_acp_turn_answers_from_stale_history(no_guard: None, home: Path, db: Any,
                                                                  llm: FakeLLMServer, server: ApiServer) -> None:
    probe.seed_session(db, SID, probe.seed_messages(), source="acp")
    sent, replies = _during_compression(llm, server, _acp_resume(home), "acp", waits=HERMES_ORDERS_TURNS)
    violations = contract_violations(db, SID, sent, replies, llm, compressed=True, head_text=HEAD)
    assert violations == [] if HERMES_ORDERS_TURNS else violations != []  # 0.20+: Hermes's lease (above)


def test_a_cron_delivery_mirrored_into_a_compressing_session_stays_live_once(
        guard: Any, db: Any, llm: FakeLLMServer, server: ApiServer) -> None:
    """Cron's own turns need no ordering: each job runs in a session of its own
    (``cron_<job>_<timestamp>``), never a turn on an existing session. What reaches an
    existing session is 0.19's cron delivery, which appends its brief to the job's origin
    session as a user message (``_maybe_mirror_cron_delivery``). Appended while an API-server turn of that
    session compresses, it stays live after the compacted block, once, and is never
    folded into the turn's own prompt."""
    from cron import scheduler

    mirror = getattr(scheduler, "_maybe_mirror_cron_delivery", None)
    if mirror is None:
        pytest.skip("this release's cron delivery does not append to an existing session")
    from hermes_state import SessionDB

    if not hasattr(SessionDB, "find_session_by_origin"):
        pytest.skip("this release's cron mirror finds the origin session in sessions.json only, not in the "
                    "state.db gateway rows this test records")
    probe.seed_session(db, SID, probe.seed_messages(), source="telegram")
    db.record_gateway_session_peer(SID, source="telegram", session_key="agent:main:telegram:dm:4242",
                                   chat_id="4242")
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    api = session_chat if HAS_SESSION_CHAT else chat_completion
    sent = marker(0, "api")
    try:
        first, replies = send_staggered(lambda t: api(server, SID, t), [sent], gap=0)
        assert llm.summary_started.wait(60), "the API turn never reached the summary call"
        mirror({"id": "job1", "name": "daily brief"}, "telegram", "4242", "brief-7f3a", enabled=True)
    finally:
        gate.set()
    first[0].join(WAIT)
    assert replies[sent].status == 200 and replies[sent].text == f"answer to [{sent}]"
    live = [(m.get("role"), str(m.get("content") or "")) for m in db.get_messages_as_conversation(SID)]
    briefs = [i for i, (_, t) in enumerate(live) if "brief-7f3a" in t]
    summaries = [i for i, (_, t) in enumerate(live) if is_summary_text(t)]
    assert len(briefs) == 1 and len(summaries) == 1 and briefs[0] > summaries[0], live
    assert sum(t == sent for _, t in live) == 1 and not any(sent in t and "brief" in t for _, t in live)
    assert sum(t == f"answer to [{sent}]" for _, t in live) == 1
    assert live[0][1].startswith(HEAD)
