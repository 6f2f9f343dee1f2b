"""The guard itself failing, seam by seam, on the real host.

For every row of the seam table that wraps something on the installed Hermes, an
exception is injected into the guard's own code behind that seam, the host is
driven through it, and the test asserts the row's ``failure_policy`` as ADR
0008 words it: fail open means Hermes does what it does without the guard and
one ERROR line names the seam; fail closed means the guarded action is refused
and says so. Whatever the policy, a real turn is still answered afterwards.

A seam that gets a wrapper on this release without a case here fails the test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit, host
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.seams import buffering, compression, compression_entry
from hermes_session_guard.seams import summaries as summary_seams
from hermes_session_guard.seams.table import SeamRow, seam_names
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import iter_message_text
from hermes_session_guard.selftest.gateway import GatewayHarness, start_gateway
from hermes_session_guard.summaries.recall_tool import RECALL_TOOL, SYSTEM_RULE

from ..fake_llm import ScriptedLLMServer, ToolCallReply
from .conftest import HOST, HOST_HAS_IN_PLACE, MODES, host_row, new_agent
from .test_recall_tool import _reachable, recall_call, turn_requests
from .tui_import import tui_server
from .waiting import send_while_busy

SID = "20260602_120000_5ea3f0"
OTHER = "20260602_120001_5ea3f1"
SYSTEM = "You are a test agent."
REPLY = "OK."
GUARD_TOOLS = {"enabled_toolsets": ["session_guard"]}
MODE_SENSITIVE = {"compression", "native_lock_reentry"}


class InjectedFault(RuntimeError):
    """Raised from inside the guard's code behind a seam."""


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise InjectedFault("injected guard fault")


@dataclass
class Ctx:
    row: SeamRow
    guard: Any
    db: Any
    llm: ScriptedLLMServer
    home: Path
    mode: str
    monkeypatch: pytest.MonkeyPatch
    caplog: pytest.LogCaptureFixture
    notes: list[str] = field(default_factory=list)

    def inject(self, owner: Any, name: str) -> None:
        self.monkeypatch.setattr(owner, name, _boom)

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records
                if r.name == "hermes_session_guard" and r.levelno >= logging.ERROR]

    def assert_said(self, policy: str) -> None:
        """At least one ERROR line, each naming this seam's target and the policy taken."""
        lines = [line for line in self.errors() if self.row.target in line]
        assert lines, f"no ERROR line names {self.row.target}: {self.errors()}"
        assert all(f"failing {policy}" in line for line in lines), lines

    def agent(self, sid: str, **kwargs: Any) -> Any:
        return new_agent(self.db, self.llm, sid, self.mode, **kwargs)

    def seeded(self, sid: str, **kwargs: Any) -> tuple[Any, list[dict]]:
        messages = probe.seed_messages()
        probe.seed_session(self.db, sid, messages)
        agent = self.agent(sid, **kwargs)
        probe.mark_flushed(agent, messages)
        return agent, messages

    def compacted(self, sid: str, **kwargs: Any) -> tuple[Any, list[dict]]:
        agent, messages = self.seeded(sid, **kwargs)
        out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
        assert len(out) < len(messages)
        return agent, out

    def real_turn(self, sid: str = "20260602_130000_7e5700", **kwargs: Any) -> dict:
        """A real turn through Hermes's own loop: it must be answered."""
        self.llm.configure(reply_fn=None, reply_text=REPLY)
        result = self.agent(sid, **kwargs).run_conversation(f"ping through {self.row.seam}")
        assert result.get("final_response") == REPLY, result
        return result

    def gateway(self, scenario: Callable[[GatewayHarness], Any]) -> tuple[GatewayHarness, Any]:
        async def run() -> tuple[GatewayHarness, Any]:
            gw = await start_gateway()
            out = await scenario(gw)
            await gw.drain()
            return gw, out

        return asyncio.run(run())


async def _gateway_turn(gw: GatewayHarness, text: str = "ping") -> None:
    await gw.send_text(text)
    await gw.drain()


def _gateway_answers(ctx: Ctx) -> GatewayHarness:
    ctx.llm.configure(reply_text=REPLY)
    gw, _ = ctx.gateway(_gateway_turn)
    assert REPLY in gw.replies(), gw.replies()
    return gw


# -- one case per seam -----------------------------------------------------------------------

CASES: dict[str, tuple[str, Callable[[Ctx], None]]] = {}


def case(*names: str, policy: str) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        for name in names:
            CASES[name] = (policy, fn)
        return fn

    return register


@case("compression", policy="closed")
def _compression(ctx: Ctx) -> None:
    # Before the host runs, on a host that compacts in place (0.18+): the guard steps aside
    # and Hermes's own compaction runs, in place (ADR 0002): the id stays, the transcript is
    # compacted, one ERROR line and a compression.failed event name the cause. On a rotating
    # host (0.13-0.17) it is skipped instead, never run unguarded (the host would rotate the
    # id, ADR 0019): messages and id unchanged; the next attempt compresses, guarded.
    agent, messages = ctx.seeded(SID)
    contents = [m["content"] for m in messages]
    with ctx.monkeypatch.context() as patch:
        patch.setattr(compression_entry, "guarded_compression", _boom)
        out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert agent.session_id == SID
    assert [r["id"] for r in probe.sessions_table(ctx.home / "state.db")] == [SID]
    assert ctx.guard.store_for(ctx.home / "state.db").list_snapshots(SID) == []
    (line,) = [line for line in ctx.errors() if ctx.row.target in line]
    assert "before the host ran" in line and "InjectedFault" in line and SID in line
    (failed,) = [e for e in audit.read_events(ctx.guard.audit_path)
                 if e.get("session_id") == SID and e["event"] == "compression.failed"]
    assert failed["stage"] == "before_host" and "InjectedFault" in failed["reason"]
    if compression.STEPS[ctx.row.behaviour.strategy].host_keeps_id:
        assert "stepping aside" in line and failed["stepped_aside"] is True
        assert len(out) < len(messages)  # Hermes compacted, as it does without the guard
        assert [m["content"] for m in probe.live_messages(ctx.home / "state.db", SID)] == \
            [m["content"] for m in out]
    else:
        ctx.assert_said("closed")
        assert [m["content"] for m in out] == contents
        assert [m["content"] for m in probe.live_messages(ctx.home / "state.db", SID)] == contents
        out, _ = agent._compress_context(out, SYSTEM, approx_tokens=150_000)  # the next threshold check
        assert len(out) < len(messages) and agent.session_id == SID
        assert len(ctx.guard.store_for(ctx.home / "state.db").list_snapshots(SID)) == 1

    # After the host ran: never run twice, nothing propagates into the turn, and the
    # caller continues with what state.db holds (the compaction, already persisted).
    ctx.caplog.clear()
    agent, messages = ctx.seeded(OTHER)
    with ctx.monkeypatch.context() as patch:
        patch.setattr(ctx.guard.compactions, "record", _boom)
        out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert len(out) < len(messages) and agent.session_id == OTHER
    assert [m["content"] for m in probe.live_messages(ctx.home / "state.db", OTHER)] == [m["content"] for m in out]
    (event,) = [e for e in audit.read_events(ctx.guard.audit_path)
                if e.get("session_id") == OTHER and e["event"] == "compression.done"]
    assert "guard error after Hermes compressed" in event["reason"] and "InjectedFault" in event["reason"]
    assert any("compression.done" in line for line in ctx.errors())
    result = agent.run_conversation("and now?", conversation_history=out)
    assert result.get("final_response") == REPLY
    live = [m["content"] for m in probe.live_messages(ctx.home / "state.db", OTHER)]
    assert live[: len(out)] == [m["content"] for m in out] and live[len(out)] == "and now?"


@case("native_lock_reentry", policy="open")
def _native_lock_reentry(ctx: Ctx) -> None:
    # Hermes's own acquire sees the guard's lease as another holder and skips:
    # the compression is skipped, never run unlocked or twice.
    agent, messages = ctx.seeded(SID)
    ctx.inject(host, "native_lock_held_here")
    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert [m["content"] for m in out] == [m["content"] for m in messages] and agent.session_id == SID
    assert [m["content"] for m in probe.live_messages(ctx.home / "state.db", SID)] == [m["content"] for m in messages]
    assert [r["id"] for r in probe.sessions_table(ctx.home / "state.db")] == [SID]
    outcome = [e for e in audit.read_events(ctx.guard.audit_path) if e.get("session_id") == SID][-1]
    assert outcome["event"] == "compression.skipped"
    ctx.assert_said("open")
    ctx.real_turn()


@case("host_commit", "compaction_commit", policy="open")
def _host_commit(ctx: Ctx) -> None:
    # 0.20+: the guard's rows cannot ride Hermes's commits (or not its compaction's); Hermes
    # compacts as it would alone and the guard writes them on its own.
    ctx.inject(compression_entry, "carry" if ctx.row.seam == "host_commit" else "compaction_commit")
    agent, out = ctx.compacted(SID)
    assert agent.session_id == SID
    store = ctx.guard.store_for(ctx.home / "state.db")
    (snap,) = store.list_snapshots(SID)
    assert [m["content"] for m in store.snapshot_messages(snap.snapshot_id)] == \
        [m["content"] for m in probe.seed_messages()]
    outcome = [e for e in audit.read_events(ctx.guard.audit_path) if e.get("session_id") == SID][-1]
    assert outcome["event"] == "compression.done" and outcome["snapshot_id"] == snap.snapshot_id, outcome
    with store.reading() as conn:
        phases = [r[0] for r in conn.execute("SELECT phase FROM session_guard_compressions WHERE session_id = ?",
                                             (SID,))]
    assert phases == ["done"]
    ctx.assert_said("open")
    ctx.real_turn()


@case("gateway_turn", policy="open")
def _gateway_turn_case(ctx: Ctx) -> None:
    ctx.inject(ctx.guard.compactions, "mark")
    _gateway_answers(ctx)
    ctx.assert_said("open")


@case("gateway_message", policy="open")
def _gateway_message(ctx: Ctx) -> None:
    """The message's chat for slash commands, and keeping the buffered queue moving after it."""
    ctx.inject(host, "gateway_message_context")
    ctx.inject(buffering, "on_handler_start")
    ctx.inject(buffering, "on_handler_done")
    _gateway_answers(ctx)
    ctx.assert_said("open")


@case("busy_message", policy="open")
def _busy_message(ctx: Ctx) -> None:
    """A message for a busy session is handled by Hermes itself (0.14: interrupt and
    pending slot; 0.19: its own queue), never buffered, never lost."""
    ctx.inject(buffering, "on_busy_message")
    release = threading.Event()

    def reply(body: dict) -> str:
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        text = " ".join(iter_message_text(users[-1].get("content"))) if users else ""
        if "first" in text:
            release.wait(15)
        return f"re: {text.strip()}"

    ctx.llm.configure(reply_fn=reply)

    async def scenario(gw: GatewayHarness) -> None:
        await gw.send_text("first")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while not host.session_running(gw.runner, gw.session_key()) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert await send_while_busy(gw, ctx.llm, "second")
        release.set()

    try:
        gw, _ = ctx.gateway(scenario)
    finally:
        release.set()
    assert any(r.endswith("second") for r in gw.replies()), gw.replies()
    db_path = host.runner_db_path(gw.runner)
    assert Inbox(ctx.guard.store_for(db_path)).entries() == []
    ctx.assert_said("open")
    ctx.llm.configure(reply_fn=None)
    _gateway_answers(ctx)


@case("buffer_drain", policy="open")
def _buffer_drain(ctx: Ctx) -> None:
    ctx.inject(buffering, "on_drain")
    _gateway_answers(ctx)
    ctx.assert_said("open")


@case("buffer_replay", policy="open")
def _buffer_replay(ctx: Ctx) -> None:
    ctx.inject(buffering, "replay")
    _gateway_answers(ctx)  # the gateway starts and answers
    ctx.assert_said("open")


@case("platform_delivery", policy="open")
def _platform_delivery(ctx: Ctx) -> None:
    ctx.inject(host, "shim_adapter")
    _gateway_answers(ctx)  # delivered unfiltered, as Hermes delivers it
    ctx.assert_said("open")


@case("summary_strip", policy="open")
def _summary_strip(ctx: Ctx) -> None:
    from agent.context_compressor import ContextCompressor

    summary = (
        "[CONTEXT COMPACTION — REFERENCE ONLY] Earlier turns were compacted.\n"
        f"[Original context: session {SID}, turns 1–40, snapshot {SID}.snapshot.20260602T120000.000000Z]\n"
        "## Goal\nship it"
    )
    ctx.inject(summary_seams, "strip_recall_header")
    assert ContextCompressor._strip_summary_prefix(summary) == \
        ContextCompressor._strip_summary_prefix.__wrapped__(summary)  # Hermes's own result
    ctx.assert_said("open")
    ctx.real_turn()


@case("transcript_load", "resume_load", policy="open")
def _load_untagged(ctx: Ctx) -> None:
    """A transcript read (``get_messages_as_conversation``; 0.20+ ``get_resume_conversations``,
    a tuple of lists) comes back as Hermes loads it, untagged; inside a session_search call
    (0.13-0.14) without the snapshots, from the live transcript."""
    import hermes_state

    if ctx.row.seam == "transcript_load" and ctx.guard.seam_patched("search_tool"):
        from tools.session_search_tool import session_search

        from hermes_session_guard.summaries import snapshot_export

        _compacted_with_token(ctx)
        ctx.inject(snapshot_export, "snapshots_for_export")
        answer = session_search(query=SEARCH_TOKEN, db=ctx.db, current_session_id=OTHER)
        assert SID in answer and '"success": true' in answer, answer  # found, and read from the live transcript
        ctx.assert_said("open")
    else:
        ctx.compacted(SID)
    ctx.inject(summary_seams, "is_summary_text")
    cls, method = ctx.row.attribute.split(".")
    loaded = getattr(ctx.db, method)(SID)
    assert loaded == getattr(getattr(hermes_state, cls), method).__wrapped__(ctx.db, SID)
    lists = loaded if isinstance(loaded, tuple) else (loaded,)
    assert not any(m.get("is_compressed_summary") for part in lists if isinstance(part, list) for m in part)
    ctx.assert_said("open")
    ctx.real_turn()


@case("wire", policy="closed")
def _wire(ctx: Ctx) -> None:
    ctx.inject(summary_seams, "provider_messages")
    # A request that carries the guard's summary keys is refused: it never reaches the provider.
    ctx.llm.reset()
    history = [
        {"role": "user", "content": "[CONTEXT COMPACTION — REFERENCE ONLY] earlier turns\n## Goal\nship it",
         "is_compressed_summary": True},
        {"role": "assistant", "content": "Understood."},
    ]
    try:
        result: dict | None = ctx.agent(SID).run_conversation("go on", conversation_history=history)
    except InjectedFault:
        result = None
    assert result is None or result.get("final_response") != REPLY, result
    sent = [m for r in ctx.llm.chat_requests() for m in r.body.get("messages") or []]
    assert not any("is_compressed_summary" in m for m in sent)
    assert any(ctx.row.target in line and "failing closed" in line for line in ctx.errors()), ctx.errors()
    # A request without them has nothing to strip: it goes out as Hermes built it.
    ctx.caplog.clear()
    ctx.real_turn()
    lines = [line for line in ctx.errors() if ctx.row.target in line]
    assert lines and all("carries none of the guard's keys" in line for line in lines), lines


@case("request_tools", policy="open")
def _request_tools(ctx: Ctx) -> None:
    ctx.inject(summary_seams, "offered")
    ctx.llm.reset()
    ctx.real_turn(**GUARD_TOOLS)
    # offered as Hermes configured it (the guard would hide it from a session without snapshots)
    assert _reachable(turn_requests(ctx.llm)[-1].body)  # (0.20+: through Hermes's tool-search bridge)
    ctx.assert_said("open")


def _row_target(row: SeamRow) -> Any:
    """The patched callable of a row (AIAgent._build_system_prompt up to 0.20, the function
    its lazy forwarder calls from 0.21)."""
    import importlib

    target: Any = importlib.import_module(row.module)
    for part in row.attribute.split("."):
        target = getattr(target, part)
    return target


@case("system_prompt", policy="open")
def _system_prompt(ctx: Ctx) -> None:
    ctx.compacted(SID, **GUARD_TOOLS)  # a session whose prompt gets the recall rule
    agent = ctx.agent(SID, **GUARD_TOOLS)
    assert SYSTEM_RULE in agent._build_system_prompt(SYSTEM)
    ctx.inject(compression, "compressing_session")
    prompt = agent._build_system_prompt(SYSTEM)
    assert prompt == _row_target(ctx.row).__wrapped__(agent, SYSTEM)  # as Hermes builds it
    assert SYSTEM_RULE not in prompt
    ctx.assert_said("open")
    ctx.real_turn(**GUARD_TOOLS)


@case("tool_session", policy="open")
def _tool_session(ctx: Ctx) -> None:
    agent, out = ctx.compacted(SID, **GUARD_TOOLS)
    ctx.inject(summary_seams, "calling_session")

    def reply(body: dict) -> Any:
        if (body["messages"][-1] or {}).get("role") == "tool":
            return "done"
        return ToolCallReply([recall_call(body, RECALL_TOOL, {"query": "deployment plan"})])

    ctx.llm.configure(reply_fn=reply)
    result = agent.run_conversation("what did we plan?", conversation_history=out)
    assert result.get("final_response") == "done", result  # the tool ran and the turn ended normally
    (answer,) = [str(m.get("content")) for m in turn_requests(ctx.llm)[-1].body["messages"]
                 if m.get("role") == "tool"]
    # Only the session id Hermes hands the tool itself: 0.19 passes the caller's, 0.14 none (nothing is read).
    assert "from this conversation" in answer or "nothing was read" in answer, answer
    ctx.assert_said("open")
    ctx.real_turn()


@case("toolset_keys", policy="open")
def _toolset_keys(ctx: Ctx) -> None:
    from hermes_cli import plugins

    ctx.inject(summary_seams, "register_waiting")
    plugins._persist_plugin_toolset_keys()  # Hermes's writer still writes this launch's keys
    written = json.loads((ctx.home / "cache" / "plugin_toolset_keys.json").read_text(encoding="utf-8"))
    assert isinstance(written.get("toolset_keys"), list), written
    ctx.assert_said("open")
    ctx.real_turn(**GUARD_TOOLS)


@case("agent_toolsets", policy="open")
def _agent_toolsets(ctx: Ctx) -> None:
    ctx.inject(summary_seams, "_with_recall_toolset")
    agent = ctx.agent(SID, enabled_toolsets=["memory"])
    assert agent.enabled_toolsets == ["memory"]  # the toolsets Hermes gave it
    ctx.assert_said("open")
    ctx.real_turn(**GUARD_TOOLS)


def _cli_screens(sid: str) -> tuple[str, str]:
    from .test_summary_visibility import _cli_screens as screens

    recap, history, _ = screens(sid)
    return recap, history


@case("cli_resume_history", "cli_history", policy="open")
def _cli(ctx: Ctx) -> None:
    import hermes_state

    ctx.monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", ctx.home / "state.db")
    ctx.compacted(SID)
    probe.import_display_modules(ctx.guard)
    ctx.inject(summary_seams, "display_messages")
    recap, history = _cli_screens(SID)
    shown = recap if ctx.row.seam == "cli_resume_history" else history
    assert "turn-46:" in shown and "CONTEXT COMPACTION" in shown  # rendered as Hermes renders it
    ctx.assert_said("open")
    ctx.real_turn()


@case("tui_history", policy="open")
def _tui(ctx: Ctx) -> None:
    from .test_summary_visibility import HOST_BLANKS_SUMMARY_ROWS, _tui_history

    ctx.compacted(SID)
    ctx.inject(summary_seams, "display_messages")
    texts = [m.get("text", "") for m in _tui_history(ctx.db, SID, ctx.monkeypatch)]
    # as Hermes renders it (with its summary up to 0.20; 0.21+ leaves out the rows it marks hidden)
    assert texts and any("CONTEXT COMPACTION" in t for t in texts) is not HOST_BLANKS_SUMMARY_ROWS
    ctx.assert_said("open")
    ctx.real_turn()


@case("api_session_messages", policy="open")
def _api(ctx: Ctx) -> None:
    from .test_summary_visibility import _api_messages

    ctx.compacted(SID)
    ctx.inject(summary_seams, "display_messages")
    data = _api_messages(ctx.db, SID)
    from gateway.platforms.api_server import APIServerAdapter

    with ctx.monkeypatch.context() as patch:
        patch.setattr(APIServerAdapter, "_handle_session_messages",
                      APIServerAdapter._handle_session_messages.__wrapped__)
        hermes_own = _api_messages(ctx.db, SID)
    # as Hermes returns it (with its summaries up to 0.21; 0.22 hides them itself)
    assert data and data == hermes_own
    ctx.assert_said("open")
    ctx.real_turn()


# Hermes's own search and export over compacted history (search_seams).
SEARCH_TOKEN = "faulttoken4242"


def _compacted_with_token(ctx: Ctx) -> None:
    import hermes_session_guard.fail_open as fail_open_log

    ctx.monkeypatch.setattr(fail_open_log, "_reported", set())  # each case sees its own first ERROR line
    messages = probe.seed_messages()
    messages[9]["content"] = f"{SEARCH_TOKEN} " + messages[9]["content"]
    probe.seed_session(ctx.db, SID, messages)
    agent = ctx.agent(SID)
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, SYSTEM, approx_tokens=150_000)


@case("search_messages", policy="open")
def _search_messages(ctx: Ctx) -> None:
    from hermes_session_guard.seams.legacy import search_index

    _compacted_with_token(ctx)
    assert [h["session_id"] for h in ctx.db.search_messages(SEARCH_TOKEN)] == [SID]
    ctx.inject(search_index, "search")
    assert ctx.db.search_messages(SEARCH_TOKEN) == []  # Hermes's own rows only: the live transcript
    assert ctx.db.search_messages("turn") != []  # and the search itself still answers
    ctx.assert_said("open")
    ctx.real_turn()


@case("search_tool", policy="open")
def _search_tool(ctx: Ctx) -> None:
    from tools.session_search_tool import session_search

    from hermes_session_guard.seams.legacy import search as search_seams

    _compacted_with_token(ctx)
    ctx.inject(search_seams, "_mark_whole_conversation")
    answer = session_search(query=SEARCH_TOKEN, db=ctx.db, current_session_id=OTHER)
    assert SID in answer and '"success": true' in answer, answer  # found, and read from the live transcript
    ctx.assert_said("open")
    ctx.real_turn()


@case("search_window", policy="open")
def _search_window(ctx: Ctx) -> None:
    from hermes_session_guard.seams.legacy import search_index

    _compacted_with_token(ctx)
    (hit,) = ctx.db.search_messages(SEARCH_TOKEN)
    assert any(SEARCH_TOKEN in str(m["content"]) for m in ctx.db.get_messages_around(SID, hit["id"])["window"])
    ctx.inject(search_index, "snapshot_window")
    assert ctx.db.get_messages_around(SID, hit["id"])["window"] == []  # Hermes's answer for an id it lacks
    ctx.assert_said("open")
    ctx.real_turn()


@case("export_session", "export_all", policy="open")
def _export(ctx: Ctx) -> None:
    from hermes_session_guard.summaries import snapshot_export

    _compacted_with_token(ctx)
    ctx.inject(snapshot_export, "snapshots_for_export")
    data = ctx.db.export_session(SID) if ctx.row.seam == "export_session" else ctx.db.export_all()[0]
    assert data["id"] == SID and data["messages"] and "session_guard_snapshots" not in data  # as Hermes exports
    ctx.assert_said("open")
    ctx.real_turn()


@case("turn_order", policy="open")
def _turn_order(ctx: Ctx) -> None:
    # The turn queue cannot be reached: the turn runs as Hermes started it, unordered.
    from hermes_session_guard.seams import turns as turn_seams

    ctx.inject(turn_seams, "turn_locks_for")
    ctx.real_turn()
    ctx.assert_said("open")


@case("turn_history", policy="open")
def _turn_history(ctx: Ctx) -> None:
    # The live transcript cannot be read: the turn runs on the history its caller passed.
    from hermes_session_guard.seams import turns as turn_seams

    ctx.inject(turn_seams, "_with_live_history")
    ctx.real_turn()
    ctx.assert_said("open")


@case("api_run_events", policy="open")
def _api_run_events(ctx: Ctx) -> None:
    # The run's events still reach its stream through Hermes's own callback.
    from hermes_session_guard.host import client_events

    from .api_turns import API_KEY, post, running_api_server

    ctx.llm.configure(reply_fn=None, reply_text=REPLY)
    ctx.inject(client_events, "run_event")
    with running_api_server(ctx.home) as srv:
        reply = post(srv.base + "/v1/runs", {"input": "ping"})
        assert reply.status in (200, 202), reply.body
        req = urllib.request.Request(f"{srv.base}/v1/runs/{reply.body['run_id']}/events",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
        with urllib.request.urlopen(req, timeout=120) as stream:
            events = [json.loads(line[6:]) for line in (raw.decode().strip() for raw in stream)
                      if line.startswith("data: ")]
    names = [e.get("event") for e in events]
    assert names[-1] == "run.completed" and "message.delta" in names, names
    ctx.assert_said("open")


@case("api_stream_comments", "api_responses_stream_comments", policy="open")
def _api_stream_comments(ctx: Ctx) -> None:
    # The writer reads Hermes's own queue: the stream is answered without comment lines.
    from hermes_session_guard.host import client_events

    from .api_turns import post, running_api_server

    ctx.llm.configure(reply_fn=None, reply_text=REPLY)
    ctx.inject(client_events, "CommentingQueue")
    with running_api_server(ctx.home) as srv:
        if ctx.row.seam == "api_stream_comments":
            reply = post(srv.base + "/v1/chat/completions", {"model": "fake-model", "stream": True,
                                                             "messages": [{"role": "user", "content": "ping"}]})
        else:
            reply = post(srv.base + "/v1/responses", {"model": "fake-model", "stream": True, "input": "ping"})
            reply.text = "".join(p.get("delta", "") for n, p in reply.body if n == "response.output_text.delta")
    assert reply.status == 200 and REPLY in reply.text, reply.body
    ctx.assert_said("open")


@case("api_session_chat_turns", "api_session_chat_stream_turns", "api_chat_completions_turns",
      "api_responses_turns", "api_runs_turns", policy="open")
def _api_turns(ctx: Ctx) -> None:
    # The handler runs as without the guard and the turn is answered.
    from hermes_session_guard.seams import turns as turn_seams

    from .api_turns import chat_completion, post, running_api_server, session_chat

    probe.seed_session(ctx.db, SID, probe.seed_messages(2, chars=40), source="api_server")
    ctx.llm.configure(reply_fn=None, reply_text=REPLY)
    ctx.inject(turn_seams, "_request_session")
    with running_api_server(ctx.home) as srv:
        if ctx.row.seam == "api_runs_turns":  # accepted, and the run is answered
            reply = post(srv.base + "/v1/runs", {"model": "fake-model", "input": "ping", "session_id": SID})
            assert reply.status == 202, reply
            assert ctx.llm.wait_for_requests(1, "chat", timeout=60)
            ctx.assert_said("open")
            return
        if ctx.row.seam == "api_responses_turns":
            reply = post(srv.base + "/v1/responses", {"model": "fake-model", "input": "ping"})
            assert reply.status == 200 and REPLY in str(reply.body), reply
            ctx.assert_said("open")
            return
        if ctx.row.seam == "api_chat_completions_turns":
            reply = chat_completion(srv, SID, "ping")
        else:
            reply = session_chat(srv, SID, "ping", stream=ctx.row.seam == "api_session_chat_stream_turns")
    assert reply.status == 200 and reply.text == REPLY, reply
    ctx.assert_said("open")


@case("tui_busy_interrupt", policy="open")
def _tui_busy_interrupt(ctx: Ctx) -> None:
    # The compaction check cannot run: the running turn is interrupted as without the guard.
    import importlib
    import threading

    from hermes_session_guard.seams import buffering

    module = importlib.import_module(ctx.row.module)
    hit = threading.Event()

    class Agent:
        session_id = SID

        def interrupt(self) -> None:
            hit.set()

    ctx.inject(buffering, "interrupt_or_queue")
    module._interrupt_busy_session("tui-1", {"history_lock": threading.Lock()}, Agent())
    assert hit.wait(30), "the running turn was not interrupted"
    ctx.assert_said("open")


@case("cli_busy_interrupt", policy="open")
def _cli_busy_interrupt(ctx: Ctx) -> None:
    # The CLI's interrupt queue cannot be set up: the turn runs, and a line typed meanwhile
    # interrupts it as without the guard (the queue stays Hermes's own).
    import contextlib
    import io
    import queue

    import cli
    import hermes_state

    from hermes_session_guard.seams import buffering

    ctx.monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", ctx.home / "state.db")
    ctx.llm.configure(reply_text=REPLY)
    probe.seed_session(ctx.db, SID, probe.seed_messages(4, chars=40), source="cli")
    app = cli.HermesCLI(resume=SID)
    assert app._preload_resumed_session()
    app._pending_input, app._interrupt_queue = queue.Queue(), queue.Queue()
    ctx.inject(buffering, "defer_cli_interrupts")
    with contextlib.redirect_stdout(io.StringIO()):
        assert app.chat("ping") == REPLY
    assert type(app._interrupt_queue) is queue.Queue
    ctx.assert_said("open")


@case("tui_prompt_enqueue", "tui_prompt_drain", policy="open")
def _tui_prompt_slot(ctx: Ctx) -> None:
    # The compaction check cannot run: the prompt goes to Hermes's own next-turn slot.
    import importlib
    import threading

    from hermes_session_guard.seams import buffering

    module = importlib.import_module(ctx.row.module)
    session: dict[str, Any] = {"history_lock": threading.Lock(), "queued_prompt": {"text": "first", "transport": None},
                               "agent": None}
    if ctx.row.seam == "tui_prompt_enqueue":  # 0.21+ queues envelopes (enqueue_apart), 0.19-0.20 one slot
        ctx.inject(buffering, "enqueue_apart" if "turn_author" in ctx.row.params else "hold_or_enqueue")
        module._enqueue_prompt(session, "second", None)
        assert "second" in session["queued_prompt"]["text"]
    else:
        session[buffering.HELD_PROMPTS] = [lambda: None]
        session["running"] = True  # nothing is started: the drain only looks
        ctx.inject(buffering, "release_held_prompt")
        assert module._drain_queued_prompt("r", "tui-1", session) is False
    ctx.assert_said("open")


# -- the table-driven test ------------------------------------------------------------------


def _wrapped_here() -> list[Any]:
    params = []
    for name in seam_names():
        row = host_row(name)
        if row is None or row.wrapper is None:
            continue
        for mode in MODES if name in MODE_SENSITIVE else MODES[:1]:
            params.append(pytest.param(name, mode, id=f"{name}-{mode}"))
    return params


@pytest.mark.parametrize(("seam", "mode"), _wrapped_here())
def test_a_guard_failure_inside_a_seam_keeps_hermes_serving(
    seam: str, mode: str, guard: Any, db: Any, llm: ScriptedLLMServer, home: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    row = host_row(seam)
    assert row is not None
    assert seam in CASES, f"seam {seam} wraps {row.target} on Hermes {HOST} but has no failure case here"
    policy, run_case = CASES[seam]
    assert row.failure_policy == policy, f"{seam}: the row says {row.failure_policy!r}, the case asserts {policy!r}"
    if not guard.seam_patched(seam):
        probe.import_display_modules(guard)  # lazy rows are patched when Hermes imports their module
    if not guard.seam_patched(seam) and row.lazy:
        import importlib

        if row.module == "tui_gateway.server":
            tui_server()  # 0.22's TUI gateway is written for Python 3.14's deferred annotations
        try:
            importlib.import_module(row.module)
        except Exception as exc:
            pytest.skip(f"Hermes's own {row.module} does not import on this Python ({type(exc).__name__}: {exc})")
    assert guard.seam_patched(seam), [s.as_dict() for s in guard.seams if s.name == seam]
    caplog.set_level(logging.INFO, logger="hermes_session_guard")
    from tools.registry import invalidate_check_fn_cache

    # Hermes caches tool availability for 30 s; an earlier test may have switched recall off.
    invalidate_check_fn_cache()
    if HOST_HAS_IN_PLACE:
        probe.write_config(home, llm.base_url, in_place=mode == "in_place")
    run_case(Ctx(row, guard, db, llm, home, mode, monkeypatch, caplog))


def test_every_case_is_for_a_seam_of_the_table() -> None:
    assert set(CASES) <= set(seam_names())
