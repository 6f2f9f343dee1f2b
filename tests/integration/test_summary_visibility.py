"""Summaries are invisible on every surface people look at (CLI resume and /history, the
TUI gateway's history, the 0.19 API server's session messages, what the gateway delivers
to a platform), shown tagged with ``summaries.visible: tagged``, and still in the model's
context."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import parse_config
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer, iter_message_text
from hermes_session_guard.selftest.gateway import start_gateway
from hermes_session_guard.summaries.tags import is_summary_text

from .conftest import HOST, MODES, host_row, new_agent
from .tui_import import tui_server

_API_ROW = host_row("api_session_messages")
HAS_SESSION_MESSAGES_ENDPOINT = _API_ROW is not None and _API_ROW.wrapper is not None
# 0.21+ projects a summary row on that endpoint as an empty row with display_kind "hidden"
HOST_BLANKS_SUMMARY_ROWS = HOST >= (0, 21, 0)
HOST_ROTATES = HOST < (0, 18, 0)  # unguarded, Hermes continues a compacted conversation under a new id

SID = "20260601_100000_cccccc"
SYSTEM = "You are a test agent."
LAST_QUESTION = "turn-46:"


def _compacted(db: Any, llm: FakeLLMServer, sid: str = SID, mode: str = "in_place") -> list[dict]:
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, mode)
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert any(is_summary_text(str(m.get("content"))) for m in compressed)
    return compressed


@pytest.fixture
def tagged(guard: Any) -> Iterator[None]:
    before = guard.config
    guard.config = parse_config({"summaries": {"visible": "tagged"}})
    yield
    guard.config = before


@pytest.fixture
def state_db(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hermes computes its default state.db path at import; follow this test's home."""
    import hermes_state

    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", home / "state.db")
    return home / "state.db"


# -- CLI ------------------------------------------------------------------------------


def _cli_screens(sid: str) -> tuple[str, str, list[dict]]:
    """What `hermes --resume SID` prints before the first prompt, then what /history prints."""
    import contextlib

    import cli
    from rich.console import Console

    app = cli.HermesCLI(resume=sid)
    recap = io.StringIO()
    app.console = Console(file=recap, width=300, force_terminal=False, color_system=None)
    assert app._preload_resumed_session()
    with contextlib.redirect_stdout(recap):
        app._display_resumed_history()
    history = io.StringIO()
    with contextlib.redirect_stdout(history):
        app.show_history()
    return recap.getvalue(), history.getvalue(), app.conversation_history


@pytest.mark.parametrize("mode", MODES)
def test_cli_resume_and_history_hide_the_summary(guard: Any, db: Any, llm: FakeLLMServer, state_db: Path,
                                                 mode: str) -> None:
    _compacted(db, llm, mode=mode)
    recap, history, live = _cli_screens(SID)
    for screen in (recap, history):
        assert "turn-46" in screen  # the conversation is there…
        assert "CONTEXT COMPACTION" not in screen and "Original context" not in screen  # …the summary is not
    # the agent's own history still carries it, tagged
    assert [m for m in live if is_summary_text(str(m.get("content")))][0]["is_compressed_summary"] is True


def test_cli_shows_the_summary_without_the_guard(no_guard: None, db: Any, llm: FakeLLMServer,
                                                 state_db: Path) -> None:
    """The seed's complaint, reproduced: the summary is rendered as an ordinary message."""
    messages = probe.seed_messages(6, 200)
    probe.seed_session(db, SID, messages)
    from hermes_session_guard.host import summary_prefixes

    db.append_message(session_id=SID, role="assistant", content=f"{summary_prefixes()[0]}\n## Goal\nx")
    recap, history, _ = _cli_screens(SID)
    assert "CONTEXT COMPACTION" in recap and "CONTEXT COMPACTION" in history


def test_cli_shows_it_when_configured_tagged(guard: Any, tagged: None, db: Any, llm: FakeLLMServer,
                                             state_db: Path) -> None:
    _compacted(db, llm)
    _, history, _ = _cli_screens(SID)
    assert "CONTEXT COMPACTION" in history


# -- TUI gateway ----------------------------------------------------------------------------


def _tui_history(db: Any, sid: str, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    server = tui_server()
    monkeypatch.setattr(server, "_db", db)
    monkeypatch.setitem(server._sessions, "tui1", {"history": [], "session_key": sid})
    reply = server._methods["session.history"](1, {"session_id": "tui1"})
    return reply["result"]["messages"]


@pytest.mark.parametrize("mode", MODES)
def test_tui_history_hides_the_summary(guard: Any, db: Any, llm: FakeLLMServer, home: Path,
                                      monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    _compacted(db, llm, mode=mode)
    shown = _tui_history(db, SID, monkeypatch)
    texts = [m.get("text", "") for m in shown]
    assert any(LAST_QUESTION in t for t in texts)
    assert not any("CONTEXT COMPACTION" in t for t in texts)


def test_tui_history_tags_the_summary_when_configured(guard: Any, tagged: None, db: Any, llm: FakeLLMServer,
                                                      home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compacted(db, llm)
    shown = _tui_history(db, SID, monkeypatch)
    summaries = [m for m in shown if "CONTEXT COMPACTION" in m.get("text", "")]
    if HOST_BLANKS_SUMMARY_ROWS:  # 0.21+'s TUI history leaves out the rows Hermes marks hidden: nothing to tag
        assert summaries == [] and not any(m.get("is_compressed_summary") for m in shown)
        assert any(LAST_QUESTION in m.get("text", "") for m in shown)
        return
    assert len(summaries) == 1 and summaries[0]["is_compressed_summary"] is True
    assert not any(m.get("is_compressed_summary") for m in shown if m not in summaries)


# -- API server (0.15+) --------------------------------------------------------------------------


def _api_messages(db: Any, sid: str) -> list[dict]:
    from aiohttp.test_utils import make_mocked_request
    from gateway.config import PlatformConfig
    from gateway.platforms.api_server import APIServerAdapter

    adapter = APIServerAdapter(PlatformConfig(enabled=True))
    adapter._api_key = ""
    adapter._session_db = db
    request = make_mocked_request("GET", f"/api/sessions/{sid}/messages", match_info={"session_id": sid})
    response = asyncio.run(adapter._handle_session_messages(request))
    assert response.status == 200
    return json.loads(response.text)["data"]


@pytest.mark.skipif(not HAS_SESSION_MESSAGES_ENDPOINT, reason="the session messages endpoint exists from 0.15")
@pytest.mark.parametrize("mode", MODES)
def test_api_server_session_messages_hide_the_summary(guard: Any, db: Any, llm: FakeLLMServer, home: Path,
                                                      mode: str) -> None:
    _compacted(db, llm, mode=mode)
    data = _api_messages(db, SID)
    assert any(LAST_QUESTION in str(m.get("content")) for m in data)
    assert not any("CONTEXT COMPACTION" in str(m.get("content")) for m in data)


@pytest.mark.skipif(not HAS_SESSION_MESSAGES_ENDPOINT, reason="the session messages endpoint exists from 0.15")
def test_api_server_tags_the_summary_when_configured(guard: Any, tagged: None, db: Any, llm: FakeLLMServer,
                                                     home: Path) -> None:
    _compacted(db, llm)
    data = _api_messages(db, SID)
    flagged = [m for m in data if m.get("is_compressed_summary")]
    assert len(flagged) == 1
    if HOST_BLANKS_SUMMARY_ROWS:  # Hermes keeps the row's id and blanks it; the guard names it
        assert flagged[0]["content"] == "" and flagged[0]["display_kind"] == "hidden"
        assert [m for m in data if m.get("display_kind") == "hidden"] == flagged
    else:
        assert "CONTEXT COMPACTION" in flagged[0]["content"]


@pytest.mark.skipif(not HAS_SESSION_MESSAGES_ENDPOINT, reason="the session messages endpoint exists from 0.15")
def test_api_server_returns_the_summary_without_the_guard(no_guard: None, db: Any, llm: FakeLLMServer,
                                                          home: Path) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    if agent.session_id != SID:  # a rotating host (0.15-0.17): its end-of-turn flush fills the child
        agent._flush_messages_to_session_db(compressed)
    data = _api_messages(db, agent.session_id)
    if HOST_BLANKS_SUMMARY_ROWS:  # Hermes alone already hides it there: verified, not duplicated
        assert not any("CONTEXT COMPACTION" in str(m.get("content")) for m in data)
        assert any(m.get("display_kind") == "hidden" for m in data)
        assert not any(m.get("is_compressed_summary") for m in data)
    else:
        assert any("CONTEXT COMPACTION" in str(m.get("content")) for m in data)


# -- what the gateway delivers to a platform --------------------------------------------------


def _regurgitating(body: dict) -> str:
    """A weak model that repeats the summary it was given before answering (#33256)."""
    summary = next((t for m in body["messages"] for t in iter_message_text(m.get("content"))
                    if is_summary_text(t)), "")
    return f"{summary}\n\nThe answer is 42."


async def _gateway_turn_after_compaction(db: Any, llm: FakeLLMServer, mode: str = "in_place"
                                         ) -> tuple[list[str], dict]:
    gw = await start_gateway(record_edits=True)
    await gw.say("hello")
    sid = gw.bound_session_id()
    messages = probe.seed_messages()
    for m in messages:
        db.append_message(session_id=sid, role=m["role"], content=m["content"])
    history = db.get_messages_as_conversation(sid)
    agent = new_agent(db, llm, sid, mode)
    probe.mark_flushed(agent, history)
    agent._compress_context(history, SYSTEM, approx_tokens=150_000)
    gw.adapter.delivered.clear()
    llm.configure(reply_fn=_regurgitating)
    await gw.say("what is the answer?")
    return list(gw.adapter.delivered), llm.chat_requests()[-1].body


@pytest.mark.parametrize("mode", MODES)
def test_gateway_never_delivers_a_summary(guard: Any, db: Any, llm: FakeLLMServer, state_db: Path,
                                          mode: str) -> None:
    delivered, request = asyncio.run(_gateway_turn_after_compaction(db, llm, mode))
    text = "\n".join(delivered)
    assert "The answer is 42." in text
    assert "CONTEXT COMPACTION" not in text and "Original context" not in text
    # the model itself still had the summary in its context
    assert any(is_summary_text(t) for m in request["messages"] for t in iter_message_text(m.get("content")))


def test_gateway_delivers_the_summary_without_the_guard(no_guard: None, db: Any, llm: FakeLLMServer,
                                                        state_db: Path) -> None:
    delivered, _ = asyncio.run(_gateway_turn_after_compaction(db, llm))
    assert "CONTEXT COMPACTION" in "\n".join(delivered)


# -- the real API server: the database it reads, found the way the release finds it ------------

def _served_messages(srv: Any, sid: str) -> list[dict]:
    import urllib.request

    from .api_turns import API_KEY

    req = urllib.request.Request(f"{srv.base}/api/sessions/{sid}/messages",
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return list(json.loads(resp.read())["data"])


@pytest.mark.skipif(not HAS_SESSION_MESSAGES_ENDPOINT, reason="the session messages endpoint exists from 0.15")
@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_the_running_api_server_hides_the_summary_wherever_it_keeps_its_database(
        request: pytest.FixtureRequest, db: Any, llm: FakeLLMServer, home: Path, guarded: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``APIServerAdapter.connect()`` on 127.0.0.1, as the gateway runs it: 0.15-0.17 keep the
    SessionDB they open as ``_session_db``, 0.19+ in the per-profile ``_session_dbs`` cache
    (``_session_db`` stays None). Guarded, no summary text in the answer on either; unguarded,
    Hermes answers it (0.21+ blank the row themselves). The compaction ran in another process
    (a CLI turn, or before the gateway restarted): the server knows it only from the guard's store."""
    from collections import OrderedDict

    from hermes_session_guard.summaries import tags

    from .api_turns import running_api_server

    request.getfixturevalue("guard" if guarded else "no_guard")
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    if agent.session_id != SID:  # unguarded on a rotating host (0.15-0.17): its end-of-turn flush fills the child
        agent._flush_messages_to_session_db(compressed)
    assert guarded == (agent.session_id == SID) or not HOST_ROTATES
    monkeypatch.setattr(tags, "_recorded", OrderedDict())  # this process's memory of the summary it wrote
    with running_api_server(home) as srv:
        data = _served_messages(srv, agent.session_id)
        adapter = srv.adapter
        kept = "_session_db" if adapter._session_db is not None else "_session_dbs"
    assert any(LAST_QUESTION in str(m.get("content")) for m in data)
    shown = [m for m in data if "CONTEXT COMPACTION" in str(m.get("content"))]
    if guarded or HOST_BLANKS_SUMMARY_ROWS:
        assert shown == [], (kept, shown[0]["content"][:80])
    else:
        assert len(shown) == 1, kept
