"""Compacted turns stay findable by Hermes's own search, guarded exactly as unguarded.

One conversation (48 messages) with a distinctive token in a turn that compression
replaces by its summary, compressed once, then searched from another session
through the real ``session_search`` tool (the model calls it; Hermes dispatches
it with its own handler), through ``SessionDB.search_messages`` directly and
through the dashboard's ``/api/sessions/search`` where this release ships one.
Every observation is made twice, in two homes: once with Hermes exactly as
shipped, once guarded; the two must be the same (same hit, same session id).
Also: nothing from another profile (its own HERMES_HOME), the calling
conversation's own lineage still excluded, and the export carries the turn.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import DEFAULT_SUMMARY_TEXT

from ..fake_llm import ScriptedLLMServer, ToolCallReply
from .conftest import (
    HOST_HAS_IN_PLACE,
    HOST_NATIVE_MODE,
    MODE_PARAMS,
    MODES,
    dashboard_unavailable,
    new_agent,
    unguarded,
)

SYSTEM = "You are a test agent."
SID = "20260603_090000_5ea5c0"  # the conversation that is compacted
OTHER = "20260603_100000_5ea5c1"  # another conversation of the same profile
STRANGER = "20260603_110000_5ea5c2"  # a conversation of another profile
TOKEN = "zephyrquartz7781"
AT = 9  # compacted away by the host's compression (head 3, tail by budget)
OPENING = f"Deploy failed on node-7 with {TOKEN}. "  # the compacted turn starts so
SUMMARY_WITH = "RECAP-HAS-THE-TURN"
SUMMARY_WITHOUT = "RECAP-WITHOUT-THE-TURN"
# Native mode (0.20+): Hermes's session_search also finds the caller's own lineage where its rows are
# compacted (active=0, compacted=1: no longer in the live context); before, it skips the whole lineage.
OWN_COMPACTED_FOUND = HOST_NATIVE_MODE
OWN_LINEAGE = sorted([SID, OTHER]) if OWN_COMPACTED_FOUND else [OTHER]
# Where Hermes has tool search (0.21+), session_search is deferred behind its bridge tools by default;
# the model here calls session_search itself, so the bridge is off.
NO_TOOL_SEARCH = {"tools": {"tool_search": False}} if importlib.util.find_spec("tools.tool_search") else None


def _reply(body: dict) -> Any:
    """The model asks session_search for the token, then answers."""
    if (body["messages"][-1] or {}).get("role") == "tool":
        return "done"
    return ToolCallReply([("session_search", {"query": TOKEN})])


def _recap(body: dict) -> str:
    """The tool's own summary call (0.13-0.14) answers whether the conversation text it
    was given holds the compacted turn."""
    prompt = " ".join(str(m.get("content")) for m in body.get("messages") or [])
    if "reviewing a past conversation transcript" not in prompt:
        return DEFAULT_SUMMARY_TEXT
    # The prompt names the query too: look only at the conversation text Hermes loaded.
    transcript = prompt.split("CONVERSATION TRANSCRIPT:", 1)[-1].split("Summarize this conversation with focus", 1)[0]
    return SUMMARY_WITH if TOKEN in transcript else SUMMARY_WITHOUT


def _tool_answer(llm: ScriptedLLMServer) -> str:
    """The tool's answer as the model got it (Hermes may cut a long one short)."""
    # the latest request that carries a tool result (an auxiliary call, e.g. the title, may come after it)
    messages = [r.body["messages"] for r in llm.chat_requests()
                if any(m.get("role") == "tool" for m in r.body.get("messages") or [])][-1]
    answer = [m["content"] for m in messages if m.get("role") == "tool"][-1]  # the latest call's
    return answer if isinstance(answer, str) else json.dumps(answer)


def _results(answer: str) -> str:
    return answer.split('"results"', 1)[1] if '"results"' in answer else ""


def _result_sessions(answer: str) -> list[str]:
    return sorted(set(re.findall(r'"session_id": "([^"]+)"', _results(answer))))


def _use_home(home: Path, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch, mode: str) -> Any:
    import hermes_state

    probe.write_config(home, llm.base_url, **({"in_place": mode == "in_place"} if HOST_HAS_IN_PLACE else {}),
                       extra=NO_TOOL_SEARCH)
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", home / "state.db")  # the dashboard's SessionDB()
    return probe.open_db(home / "state.db")


def _search_tool(db: Any, llm: ScriptedLLMServer, sid: str, mode: str, history: list | None = None) -> str:
    """The model calls session_search; Hermes dispatches it to its own tool function. Returns
    what that function answered (the model may get it cut short, 0.15+ windows are long)."""
    import tools.session_search_tool as tool
    from tools.registry import invalidate_check_fn_cache

    invalidate_check_fn_cache()
    llm.reset()
    llm.configure(reply_fn=_reply, summary_fn=_recap)
    answers: list[str] = []
    real = tool.session_search

    def recorded(*args: Any, **kwargs: Any) -> str:
        answers.append(real(*args, **kwargs))
        return answers[-1]

    tool.session_search = recorded  # the dispatcher imports it at call time
    try:
        agent = new_agent(db, llm, sid, mode, enabled_toolsets=["session_search"])
        result = agent.run_conversation("what was the error on node-7?", conversation_history=history or [])
    finally:
        tool.session_search = real
    assert result.get("final_response") == "done", result
    (answer,) = answers
    assert _tool_answer(llm)[:60] == answer[:60]  # the model got this answer
    return answer


def _dashboard(query: str) -> list[dict] | None:
    if dashboard_unavailable():
        return None
    from fastapi.testclient import TestClient
    from hermes_cli import web_server

    client = TestClient(web_server.app, base_url="http://127.0.0.1")
    response = client.get("/api/sessions/search", params={"q": query},
                          headers={"Authorization": f"Bearer {web_server._SESSION_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _dashboard_export(sid: str) -> str | None:
    if dashboard_unavailable():
        return None
    from fastapi.testclient import TestClient
    from hermes_cli import web_server

    if not any(getattr(r, "path", "") == "/api/sessions/{session_id}/export" for r in web_server.app.routes):
        return None
    client = TestClient(web_server.app, base_url="http://127.0.0.1")
    response = client.get(f"/api/sessions/{sid}/export",
                          headers={"Authorization": f"Bearer {web_server._SESSION_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.text


def _observe(home: Path, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch, mode: str) -> dict[str, Any]:
    """Compact SID once, then look for the token every way Hermes offers."""
    db = _use_home(home, llm, monkeypatch, mode)
    messages = probe.seed_messages()
    messages[AT]["content"] = OPENING + messages[AT]["content"]
    probe.seed_session(db, SID, messages)
    probe.seed_session(db, OTHER, probe.seed_messages(4, 200, tag="other"))
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    agent._flush_messages_to_session_db(compressed, [])
    assert TOKEN not in json.dumps(compressed)  # really compacted away

    seen: dict[str, Any] = {"live_id": agent.session_id}
    hits = db.search_messages(TOKEN)
    seen["hits"] = sorted({(h["session_id"], h["role"], TOKEN in (h.get("snippet") or "")) for h in hits})
    seen["user_only"] = sorted({h["session_id"] for h in db.search_messages(TOKEN, role_filter=["user"])})
    seen["hidden_source"] = db.search_messages(TOKEN, exclude_sources=["cli"])
    # limit / offset page through one ordered list (live rows and snapshot rows together)
    page = [h["id"] for h in db.search_messages("deployment", limit=6, offset=4)]
    seen["paging"] = page == [h["id"] for h in db.search_messages("deployment", limit=10)][4:10] and len(page) == 6
    dash = _dashboard(TOKEN[:9])  # the dashboard adds a prefix wildcard
    # (0.19's dashboard names a rotated conversation by its tip: either id is this conversation)
    lineage = {SID, agent.session_id}
    seen["dashboard"] = None if dash is None else sorted(
        {("this conversation" if r["session_id"] in lineage else r["session_id"], TOKEN in r["snippet"])
         for r in dash})
    # (Each tool call below is itself stored in its caller's transcript, query included.)
    from_other = _search_tool(db, llm, OTHER, mode)
    seen["tool_sessions"] = _result_sessions(from_other)
    # 0.13-0.14: the tool's summary call was given the turn; 0.15+: the hit's window shows it.
    seen["tool_shows_turn"] = SUMMARY_WITH in from_other or f'"content": "{OPENING}' in _results(from_other)
    own = _search_tool(db, llm, agent.session_id, mode, history=compressed)
    seen["own_lineage"] = _result_sessions(own)
    exported = db.export_session(SID)
    seen["export_has_turn"] = TOKEN in json.dumps(exported)
    dash_export = _dashboard_export(SID)  # 0.16+: the dashboard's export of the session
    seen["dashboard_export_has_turn"] = None if dash_export is None else TOKEN in dash_export
    seen["sessions"] = sorted(s["id"] for s in db.list_sessions_rich(limit=50))
    db.close()
    return seen


def _stranger(home: Path, llm: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch, mode: str) -> dict[str, Any]:
    """Another profile: its own HERMES_HOME and state.db."""
    db = _use_home(home, llm, monkeypatch, mode)
    probe.seed_session(db, STRANGER, probe.seed_messages(4, 200, tag="stranger"))
    seen: dict[str, Any] = {"hits": db.search_messages(TOKEN), "dashboard": _dashboard(TOKEN[:9])}
    seen["tool"] = _result_sessions(_search_tool(db, llm, STRANGER, mode))
    db.close()
    return seen


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_a_compacted_turn_is_found_guarded_exactly_as_unguarded(
    guard: Any, llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    with unguarded():
        plain = _observe(tmp_path / "unguarded", llm, monkeypatch, mode)
        stranger_unguarded = _stranger(tmp_path / "unguarded-other-profile", llm, monkeypatch, mode)
    guarded = _observe(tmp_path / "guarded", llm, monkeypatch, mode)
    stranger_guarded = _stranger(tmp_path / "guarded-other-profile", llm, monkeypatch, mode)

    # Found from another conversation through the real tool, attributed to the conversation's id,
    # and the tool reads the verbatim turn (0.13-0.14: its summary call got it; 0.15+: the window shows it).
    for seen in (plain, guarded):
        assert seen["tool_sessions"] == [SID], seen
        assert seen["tool_shows_turn"], seen
        assert (SID, "user", True) in seen["hits"] or (SID, "assistant", True) in seen["hits"], seen["hits"]
        assert seen["hidden_source"] == []  # Hermes's source filter holds for snapshot rows too
        assert seen["paging"]
        # its own lineage excluded (native mode: but for its compacted turn); OTHER's stored tool call matches
        assert seen["own_lineage"] == OWN_LINEAGE
    assert guarded["export_has_turn"]  # 0.19 in place: Hermes's own export leaves archived rows out
    assert plain["export_has_turn"] or HOST_HAS_IN_PLACE and mode == "in_place"
    assert guarded["dashboard_export_has_turn"] in (None, True)
    assert plain["dashboard_export_has_turn"] in (None, plain["export_has_turn"])
    assert guarded["live_id"] == SID  # the guard kept the id
    # Same hits, same ids, guarded and unguarded (only the rows' own session ids: the
    # unguarded rotation also leaves a child session, which holds no copy of the turn).
    assert guarded["hits"] == plain["hits"]
    assert guarded["user_only"] == plain["user_only"]
    assert guarded["tool_sessions"] == plain["tool_sessions"]
    assert guarded["own_lineage"] == plain["own_lineage"]
    assert guarded["dashboard"] == plain["dashboard"]
    if not dashboard_unavailable():
        assert guarded["dashboard"] == [("this conversation", True)]
    # No extra sessions in Hermes's list: SID and OTHER (unguarded, a rotation is listed as its tip).
    assert guarded["sessions"] == sorted([SID, OTHER])
    assert len(guarded["sessions"]) == len(plain["sessions"])
    # Another profile finds nothing, either way.
    for seen in (stranger_unguarded, stranger_guarded):
        assert seen["hits"] == [] and seen["tool"] == [], seen
        assert seen["dashboard"] in (None, []), seen


def test_export_marks_the_snapshot_rows(guard: Any, llm: ScriptedLLMServer, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The export of a session carries its snapshots, marked as such and verbatim, beside
    Hermes's own rows (the live transcript)."""
    db = _use_home(tmp_path / "home", llm, monkeypatch, MODES[0])
    messages = probe.seed_messages()
    messages[AT]["content"] = f"{TOKEN} " + messages[AT]["content"]
    probe.seed_session(db, SID, messages)
    probe.seed_session(db, OTHER, probe.seed_messages(4, 200, tag="other"))
    agent = new_agent(db, llm, SID, MODES[0])
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert guard.seam_patched("export_session") and guard.seam_patched("export_all")
    exported = {s["id"]: s for s in db.export_all()}
    for data in (exported[SID], db.export_session(SID)):
        (snap,) = data["session_guard_snapshots"]
        assert snap["kind"] == "session_guard_snapshot" and snap["message_count"] == len(messages)
        assert [m["content"] for m in snap["messages"]] == [m["content"] for m in messages]  # verbatim
        assert TOKEN not in json.dumps(data["messages"])  # Hermes's own rows: the live transcript
    assert "session_guard_snapshots" not in exported[OTHER]  # a session without snapshots is as Hermes exports it
    assert "session_guard_snapshots" not in db.export_session(OTHER)
    db.close()


def _seed_with_token(db: Any) -> list[dict]:
    messages = probe.seed_messages()
    messages[AT]["content"] = OPENING + messages[AT]["content"]
    probe.seed_session(db, SID, messages)
    probe.seed_session(db, OTHER, probe.seed_messages(4, 200, tag="other"))
    return messages


def _found_from_other(db: Any, llm: ScriptedLLMServer, mode: str) -> tuple[list[str], bool]:
    answer = _search_tool(db, llm, OTHER, mode)
    return _result_sessions(answer), SUMMARY_WITH in answer or f'"content": "{OPENING}' in _results(answer)


def test_a_lineage_repair_keeps_the_compacted_turn_findable(
    guard: Any, llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hermes rotated on its own (before the guard was there); `repair --apply` brings the
    lineage back under the original id: the turn is found as before, under that id."""
    from hermes_session_guard.commands import cli

    mode = "rotate"
    db = _use_home(tmp_path / "home", llm, monkeypatch, mode)
    messages = _seed_with_token(db)
    with unguarded():
        agent = new_agent(db, llm, SID, mode)
        probe.mark_flushed(agent, messages)
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
        agent._flush_messages_to_session_db(compressed, [])
    assert agent.session_id != SID
    before = _found_from_other(db, llm, mode)
    db.close()
    capsys.readouterr()
    assert cli.main(["repair", "--apply"]) == 0, capsys.readouterr()
    db = probe.open_db(tmp_path / "home" / "state.db")
    after = _found_from_other(db, llm, mode)
    assert before == after == ([SID], True)
    assert SID in {h["session_id"] for h in db.search_messages(TOKEN)}
    db.close()


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_a_handed_off_parent_stays_findable_and_its_child_is_its_lineage(
    guard: Any, llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """After a hand-off the conversation continues in a child of SID: another conversation
    still finds the compacted turn under SID; the child, whose lineage SID is, does not
    (native mode, 0.20+: Hermes finds the parent's compacted rows from the child too, as it
    finds a session's own compacted rows: out of its context)."""
    from hermes_session_guard.config import GuardConfig, parse_config

    hermes_session_guard.install(parse_config({"handoff": {"enabled": True, "mode": "fresh_session",
                                                           "after_compressions": 1}}))
    try:
        db = _use_home(tmp_path / "home", llm, monkeypatch, mode)
        messages = _seed_with_token(db)
        agent = new_agent(db, llm, SID, mode)
        probe.mark_flushed(agent, messages)
        seeded, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
        child = agent.session_id
        assert child != SID and TOKEN not in json.dumps(seeded)
        assert [r["id"] for r in probe.sessions_table(tmp_path / "home" / "state.db")
                if r["parent_session_id"] == SID] == [child]
        assert _found_from_other(db, llm, mode) == ([SID], True)
        # the child's lineage is skipped (native mode: but for the parent's compacted rows, out of its context)
        assert (SID in _result_sessions(_search_tool(db, llm, child, mode, history=seeded))) == OWN_COMPACTED_FOUND
        db.close()
    finally:
        hermes_session_guard.install(GuardConfig())


def test_the_guard_export_command_writes_hermes_export_with_the_snapshots(
    guard: Any, llm: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`hermes sessions export` starts without plugins on 0.13-0.17; `hermes-session-guard
    export` gives the same JSON line with the compacted history."""
    from hermes_session_guard.commands import cli

    db = _use_home(tmp_path / "home", llm, monkeypatch, MODES[0])
    messages = _seed_with_token(db)
    agent = new_agent(db, llm, SID, MODES[0])
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    hermes_session_guard.uninstall()  # as in a process where Hermes loaded no plugin
    try:
        plain = db.export_session(SID)
        out = tmp_path / "export.jsonl"
        assert cli.main(["export", SID, "-o", str(out)]) == 0, capsys.readouterr()
    finally:
        hermes_session_guard.install()
    data = json.loads(out.read_text(encoding="utf-8"))
    assert {k: v for k, v in data.items() if k != "session_guard_snapshots"} == json.loads(json.dumps(plain))
    (snap,) = data["session_guard_snapshots"]
    assert snap["kind"] == "session_guard_snapshot" and OPENING in snap["messages"][AT]["content"]
    assert out.stat().st_mode & 0o777 == 0o600
    assert cli.main(["export", "nosuchsession"]) == 1
    db.close()
