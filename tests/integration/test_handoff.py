"""Bounded hand-off after repeated compressions, on the real host: the packet and its
redaction, refused path escapes, prompt_user, the explicit fresh_session fork
(agent and gateway), failure injection at child creation, and the bound."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.config import GuardConfig, parse_config
from hermes_session_guard.handoff.packet import PACKET_HEADING, SEED_MARKER
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.selftest.gateway import GatewayHarness, start_gateway

from .conftest import HOST_HAS_IN_PLACE, HOST_NATIVE_MODE, MODE_PARAMS, MODES, new_agent
from .waiting import send_while_busy

SID = "20260528_093510_66bfaec7"
SYSTEM = "You are a test agent."

# Fake credentials planted in the conversation: none of them may reach a packet.
SECRETS = {
    "openai": "sk-proj-PLANTEDsummaryKEY1234567890abcd",
    "github": "ghp_PLANTEDgithubTOKEN0123456789abcdef",
    "bearer": "PLANTEDbearerTOKENvalue0123456789",
    "url_password": "Pl4ntedUrlPassw0rd",
    "password": "Sup3rS3cretPW",
    "aws": "AKIAPLANTED0EXAMPLE1",
    "aws_secret": "PLANTEDawsSECRETkey0123456789abcdefABCD",
    "host_only": "exa_PLANTEDhostONLY123",
}
# The distinctive middle of each secret (a partial mask must not keep it either).
CORES = ["PLANTEDsummaryKEY", "PLANTEDgithubTOKEN", "PLANTEDbearerTOKEN", "Pl4ntedUrlPassw0rd", "Sup3rS3cretPW",
         "PLANTED0EXAMPLE1", "PLANTEDawsSECRET", "PLANTEDhostONLY"]

SUMMARY_WITH_SECRETS = (
    "## Goal\nShip the deployment plan for the payments service.\n\n"
    "## Pending User Asks\n- Should we rotate the staging database password before Friday?\n\n"
    "## Blocked\n- Waiting on credentials: password=" + SECRETS["password"] + "\n\n"
    "## Relevant Files\n- deploy.env has OPENAI_API_KEY=" + SECRETS["openai"] + "\n"
    "- aws_secret_access_key = " + SECRETS["aws_secret"] + "\n"
)
REQUEST_WITH_SECRETS = (
    f"Deploy with token {SECRETS['github']} and header Authorization: Bearer {SECRETS['bearer']}; the mirror is "
    f"https://deploy:{SECRETS['url_password']}@git.example.com/pay.git and search uses {SECRETS['host_only']}. "
    "What do you think?"
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def handoff(guard: Any) -> Iterator[Callable[..., Any]]:
    """Switch the hand-off on with the given ``handoff:`` options for one test."""
    import hermes_session_guard

    def apply(**options: Any) -> Any:
        return hermes_session_guard.install(parse_config({"handoff": {"enabled": True, **options}}))

    yield apply
    hermes_session_guard.install(GuardConfig())


def _seeded_agent(db: Any, llm: FakeLLMServer, mode: str, sid: str = SID) -> tuple[Any, list]:
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, mode)
    probe.mark_flushed(agent, messages)
    return agent, messages


def _compress(agent: Any, history: list, round_no: int) -> list:
    """One real compression: the conversation has grown by 48 big messages since the last one."""
    messages = history + probe.seed_messages(tag=f"r{round_no}") if round_no else history
    compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    assert len(compressed) < len(messages), "the host made no progress"
    return compressed


def _events(runtime: Any, name: str | None = None) -> list[dict]:
    events = audit.read_events(runtime.audit_path)
    return [e for e in events if name is None or e["event"] == name]


def _rows(home: Path) -> dict[str, dict]:
    return {r["id"]: r for r in probe.sessions_table(home / "state.db")}


def _turn_leases(home: Path) -> list[tuple[str, str]]:
    """Hermes 0.20+'s durable turn leases left in state.db (none before 0.20)."""
    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        return [(r[0], r[1]) for r in conn.execute("SELECT conversation_id, holder FROM session_turn_leases")]
    except sqlite3.OperationalError:  # no such table
        return []
    finally:
        conn.close()


def _contents(home: Path, sid: str) -> list[str]:
    return [str(m["content"]) for m in probe.live_messages(home / "state.db", sid)]


def _packets(home: Path) -> list[Path]:
    return sorted((home / "handoffs").glob("*.md")) if (home / "handoffs").is_dir() else []


def _log_tag() -> str | None:
    import hermes_logging

    return getattr(hermes_logging._session_context, "session_id", None)


def _gateway_contextvar() -> str | None:
    from gateway import session_context

    return session_context._SESSION_ID.get(None)


def _git_repo(path: Path) -> str | None:
    """A repository on branch ``feature/payments``; its short commit (``None`` without git)."""
    path.mkdir()
    if shutil.which("git") is None:
        return None
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e")
    for cmd in (["init", "-q"], ["checkout", "-q", "-b", "feature/payments"],
                ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", "-C", str(path), *cmd], check=True, env=env, capture_output=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


# -- the packet --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_packet_holds_the_session_brief_and_no_secret(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path, tmp_path: Path, mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = handoff(mode="prompt_user", after_compressions=1)
    commit = _git_repo(tmp_path / "repo")
    monkeypatch.setenv("TERMINAL_CWD", str(tmp_path / "repo"))
    history = probe.seed_messages()
    history[-1]["content"] += ". Which region should I deploy to?"
    probe.seed_session(db, SID, history)
    db.set_session_title(SID, "Payments deploy")
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, history)
    agent._todo_store.write([
        {"id": "1", "content": f"Rotate AWS key {SECRETS['aws']}", "status": "in_progress"},
        {"id": "2", "content": "Write the release notes", "status": "pending"},
    ])
    llm.configure(summary_text=SUMMARY_WITH_SECRETS, reply_text="Let me look.")

    agent.run_conversation(REQUEST_WITH_SECRETS, conversation_history=history)

    (packet,) = _packets(home)
    text = packet.read_text(encoding="utf-8")
    snapshot_ids = [s.snapshot_id for s in runtime.store_for(home / "state.db").list_snapshots(SID)]
    assert text.startswith(PACKET_HEADING)
    assert f"- Session: `{SID}`" in text
    assert "- Title: Payments deploy" in text
    assert f"- Working directory: `{tmp_path / 'repo'}`" in text
    if commit is not None:
        assert f"- Git: branch `feature/payments` at `{commit}`" in text
    assert "Ship the deployment plan for the payments service." in text  # latest summary
    assert "- [>] 1. Rotate AWS key" in text and "- [ ] 2. Write the release notes (pending)" in text
    assert "> Deploy with token" in text and "What do you think?" in text  # last user request
    assert "- Should we rotate the staging database password before Friday?" in text  # open questions
    assert "- Which region should I deploy to?" in text
    assert snapshot_ids and all(f"`{s}`" in text for s in snapshot_ids)
    for secret in [*SECRETS.values(), *CORES]:
        assert secret not in text, secret
    if os.name == "posix":
        assert stat.S_IMODE(packet.stat().st_mode) == 0o600
    assert not [p for p in packet.parent.iterdir() if p.name.endswith(".tmp")]
    # the notice and the audit trail carry the path, never the packet's text
    events = json.dumps(audit.read_events(runtime.audit_path))
    assert str(packet) in events and not any(core in events for core in CORES)


@pytest.mark.skipif(os.name != "posix", reason="symlinks need privileges on Windows")
def test_artifact_dir_escaping_hermes_home_is_refused(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path, tmp_path: Path
) -> None:
    """A symlink inside HERMES_HOME pointing elsewhere: nothing is written outside,
    the compression stands, and the hand-off count is not consumed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (home / "handoffs").symlink_to(outside, target_is_directory=True)
    runtime = handoff(mode="fresh_session", after_compressions=1)
    agent, messages = _seeded_agent(db, llm, "in_place")

    compressed = _compress(agent, messages, 0)

    assert list(outside.iterdir()) == []
    assert agent.session_id == SID and list(_rows(home)) == [SID]
    assert _contents(home, SID) == [str(m["content"]) for m in compressed]
    (failed,) = _events(runtime, "handoff.failed")
    assert failed["stage"] == "packet" and "outside" in failed["reason"] and failed["count_consumed"] is False
    assert runtime.store_for(home / "state.db").handoffs(lineage_root=SID) == []


@pytest.mark.parametrize("artifact_dir", ["../outside", "/tmp/elsewhere", "a/../../b"])
def test_cli_keeps_the_default_artifact_dir_for_one_outside_hermes_home(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, artifact_dir: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad option never switches anything off (docs/configuration.md; its WARNING line is
    test_option_bounds.py's): the packet goes to the default ``handoffs/`` inside the home,
    and nothing is written outside it."""
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    probe.write_config(home, llm.base_url, extra={"session_guard": {"handoff": {"artifact_dir": artifact_dir}}})
    assert main(["handoff", SID]) == 0
    path = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert path.parent == (home / "handoffs").resolve() and _packets(home) == [path]
    assert not (home.parent / "outside").exists() and not Path("/tmp/elsewhere").exists()


def test_cli_writes_a_packet_on_request(guard: Any, db: Any, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.commands.cli import main

    messages = probe.seed_messages(6)
    messages[-2]["content"] = f"please use {SECRETS['openai']} for the rollout"
    probe.seed_session(db, SID, messages)
    assert main(["handoff", SID, "--note", "before the freeze"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == (home / "handoffs").resolve()
    text = path.read_text(encoding="utf-8")
    assert "## Note\n\nbefore the freeze" in text and "please use [REDACTED] for the rollout" in text
    assert SECRETS["openai"] not in text
    assert main(["handoff", "no-such-session"]) == 1
    assert [r.mode for r in guard.store_for(home / "state.db").handoffs(session_id=SID)] == ["manual"]


# -- fresh_session on the agent ---------------------------------------------------------
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_fresh_session_forks_explicitly_and_switches_every_id(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    runtime = handoff(mode="fresh_session", after_compressions=2)
    agent, messages = _seeded_agent(db, llm, mode)
    import hermes_logging

    hermes_logging.set_session_context(SID)
    os.environ["HERMES_SESSION_ID"] = SID

    first = _compress(agent, messages, 0)
    assert agent.session_id == SID and list(_rows(home)) == [SID]  # 1 of 2: an ordinary compression
    with probe.capture_host_compression_logs() as lines:
        seeded = _compress(agent, first, 1)

    child = agent.session_id
    assert child != SID
    # the compression itself stayed on SID; the move is a separate, logged fork
    assert set(probe.session_ids_in(lines)) == {SID}
    done = _events(runtime, "compression.done")[-1]
    assert done["session_id"] == SID and done["session_id_after"] == SID
    (fork,) = _events(runtime, "fork.created")
    assert fork["parent_session_id"] == SID and fork["child_session_id"] == child
    assert fork["op_id"] == done["op_id"] and fork["handoff_seq"] == 1
    # every place that names the live session now names the child
    assert os.environ["HERMES_SESSION_ID"] == child and _gateway_contextvar() == child and _log_tag() == child
    rows = _rows(home)
    assert rows[child]["parent_session_id"] == SID and rows[child]["ended_at"] is None
    assert rows[SID]["end_reason"] == "handoff"
    # the child opens with the packet, an acknowledgement, then the in-flight exchange
    assert seeded[0]["content"].startswith(SEED_MARKER) and seeded[1]["role"] == "assistant"
    assert _contents(home, child) == [str(m["content"]) for m in seeded]
    assert seeded[2]["content"].startswith("r1-46:")
    # the next turn is persisted in the child, after the seed, once
    llm.configure(reply_text="answer in the child")
    agent.run_conversation("what next?", conversation_history=seeded)
    assert _contents(home, child)[len(seeded):] == ["what next?", "answer in the child"]
    # the turn's own request: the longest naming it (an auxiliary call, e.g. the title, may come after it)
    sent = max((r.body["messages"] for r in llm.chat_requests()
                if any(m.get("content") == "what next?" for m in r.body["messages"])), key=len)
    assert any(SEED_MARKER in str(m.get("content")) and SID in str(m.get("content")) for m in sent)
    assert not any("r1-20:" in str(m.get("content")) for m in sent)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_failed_child_creation_keeps_the_original_id_and_the_count(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = handoff(mode="fresh_session", after_compressions=1)
    agent, messages = _seeded_agent(db, llm, mode)
    import hermes_logging

    hermes_logging.set_session_context(SID)
    os.environ["HERMES_SESSION_ID"] = SID
    real_create = db.create_session

    def refuse_children(session_id: str, source: str, **kwargs: Any) -> str:
        if kwargs.get("parent_session_id"):
            raise sqlite3.OperationalError("database is locked")
        return real_create(session_id, source, **kwargs)

    monkeypatch.setattr(db, "create_session", refuse_children)
    compressed = _compress(agent, messages, 0)

    assert agent.session_id == SID and os.environ["HERMES_SESSION_ID"] == SID and _log_tag() == SID
    assert list(_rows(home)) == [SID] and _rows(home)[SID]["ended_at"] is None
    assert _contents(home, SID) == [str(m["content"]) for m in compressed]  # ordinary compressed continuation
    assert not any(SEED_MARKER in str(m["content"]) for m in compressed)
    (failed,) = _events(runtime, "handoff.failed")
    assert failed["stage"] == "create_child" and failed["count_consumed"] is False
    assert "database is locked" in failed["reason"] and not _events(runtime, "fork.created")
    store = runtime.store_for(home / "state.db")
    assert store.handoffs(lineage_root=SID) == []

    monkeypatch.setattr(db, "create_session", real_create)
    _compress(agent, compressed, 1)
    (fork,) = _events(runtime, "fork.created")
    assert fork["handoff_seq"] == 1 and agent.session_id == fork["child_session_id"]


@pytest.mark.parametrize("max_auto_handoffs", [1, 2])
def test_the_bound_holds_across_repeated_compressions(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path, max_auto_handoffs: int
) -> None:
    runtime = handoff(mode="fresh_session", after_compressions=1, max_auto_handoffs=max_auto_handoffs)
    agent, history = _seeded_agent(db, llm, MODES[0])
    for round_no in range(max_auto_handoffs + 3):
        history = _compress(agent, history, round_no)

    forks = _events(runtime, "fork.created")
    assert len(forks) == max_auto_handoffs
    chain = [SID] + [f["child_session_id"] for f in forks]
    assert [f["parent_session_id"] for f in forks] == chain[:-1]
    assert agent.session_id == chain[-1]
    rows = _rows(home)
    assert set(rows) == set(chain)
    assert [rows[c]["parent_session_id"] for c in chain[1:]] == chain[:-1]
    assert len(_events(runtime, "handoff.bounded")) == 3
    records = runtime.store_for(home / "state.db").handoffs(lineage_root=SID)
    assert [(r.seq, r.status) for r in records] == [(n, "done") for n in range(1, max_auto_handoffs + 1)]


def test_prompt_user_leaves_the_session_alone(handoff: Any, db: Any, llm: FakeLLMServer, home: Path) -> None:
    runtime = handoff(mode="prompt_user", after_compressions=2)
    agent, history = _seeded_agent(db, llm, MODES[0])
    shown: list[str] = []
    agent.status_callback = lambda kind, text: shown.append(text)
    for round_no in range(3):
        history = _compress(agent, history, round_no)
    assert agent.session_id == SID and list(_rows(home)) == [SID] and _rows(home)[SID]["ended_at"] is None
    assert _contents(home, SID) == [str(m["content"]) for m in history]
    (packet,) = _packets(home)
    assert [t for t in shown if str(packet) in t and "/new" in t]  # told once, after the 2nd compression
    assert len(_events(runtime, "handoff.prompted")) == 1 and not _events(runtime, "fork.created")


# -- through the gateway ----------------------------------------------------------------
async def _chat_with_history(gw: GatewayHarness, llm: FakeLLMServer, n: int = 48) -> str:
    llm.configure(prompt_tokens=500)
    await gw.send_text("hi")
    await gw.drain()
    sid = gw.bound_session_id()
    assert sid
    for m in probe.seed_messages(n, tag="hist"):
        gw.runner.session_store.append_to_transcript(sid, m)
    llm.configure(prompt_tokens=None)
    return sid


def _set_in_place(home: Path, llm: FakeLLMServer, mode: str) -> None:
    if HOST_HAS_IN_PLACE:
        probe.write_config(home, llm.base_url, in_place=(mode == "in_place"))


def _routing_on_disk(home: Path) -> dict[str, str]:
    data = json.loads((home / "sessions" / "sessions.json").read_text(encoding="utf-8"))
    out = {k: v["session_id"] for k, v in data.items() if not k.startswith("_")}
    conn = sqlite3.connect(str(home / "state.db"))
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'gateway_routing'").fetchone():
            for key, entry in conn.execute("SELECT session_key, entry_json FROM gateway_routing"):
                assert json.loads(entry)["session_id"] == out[key], "gateway_routing and sessions.json disagree"
    finally:
        conn.close()
    return out


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_gateway_fresh_session_moves_routing_and_the_next_message_lands_in_the_child(
    handoff: Any, llm: FakeLLMServer, home: Path, mode: str
) -> None:
    _set_in_place(home, llm, mode)
    runtime = handoff(mode="fresh_session", after_compressions=1)

    during_turn: list[tuple[str | None, str]] = []

    async def scenario() -> tuple[GatewayHarness, str, str | None]:
        gw = await start_gateway()
        sid = await _chat_with_history(gw, llm)

        def first_answer(body: dict) -> str:
            # the model is called after the compression and the fork, before the turn ends
            during_turn.append((gw.bound_session_id(), _routing_on_disk(home)[gw.session_key()]))
            return "first answer"

        llm.configure(reply_fn=first_answer)
        await gw.send_text("question one")
        await gw.drain()
        child = gw.bound_session_id()
        llm.configure(reply_fn=None, reply_text="second answer")
        await gw.send_text("question two")
        await gw.drain()
        return gw, sid, child

    gw, sid, child = run(scenario())

    assert child and child != sid and gw.bound_session_id() == child
    # routing moved with the fork itself (memory and disk), not by the host's after-turn sync
    assert during_turn == [(child, child)]
    assert _routing_on_disk(home) == {gw.session_key(): child}
    (fork,) = _events(runtime, "fork.created")
    assert (fork["parent_session_id"], fork["child_session_id"], fork["gateway_keys"]) == (sid, child, 1)
    rows = _rows(home)
    assert rows[child]["parent_session_id"] == sid and rows[sid]["end_reason"] == "handoff"
    assert (rows[child]["source"], rows[child]["user_id"]) == (rows[sid]["source"], rows[sid]["user_id"])
    live = _contents(home, child)
    assert live[0].startswith(SEED_MARKER)
    assert live[2:] == ["question one", "first answer", "question two", "second answer"]
    # the message after the hand-off was answered from the child's context: packet + the previous turn
    sent = llm.chat_requests()[-1].body["messages"]
    assert any(SEED_MARKER in str(m.get("content")) for m in sent)
    assert [m.get("content") for m in sent if m.get("role") in ("user", "assistant")][-3:] == [
        "question one", "first answer", "question two"]
    assert not any("hist-20:" in str(m.get("content")) for m in sent)
    replies = gw.replies()
    assert replies[-2:] == ["first answer", "second answer"]
    assert any(child in r and "hand-off packet" in r for r in replies)
    # 0.20+: the forking turn wrote its answer under the child's turn lease and gave it back
    assert _turn_leases(home) == []


@pytest.mark.parametrize("agent_cached", [True, False], ids=["cached-agent", "agent-rebuilt"])
def test_gateway_message_sent_during_the_fork_turn_lands_in_the_child(
    handoff: Any, llm: FakeLLMServer, home: Path, agent_cached: bool
) -> None:
    """Peer agents keep talking: a message that arrives while the turn that forked is
    still running is drained by the gateway with the id that turn started on; it must
    be answered in the child, with the child's context, not in the ended parent (no
    amnesia loop), also when the follow-up builds a new agent (cache evicted)."""
    import threading

    runtime = handoff(mode="fresh_session", after_compressions=1)
    in_reply, release = threading.Event(), threading.Event()
    gateway: list[GatewayHarness] = []

    def held_answer(body: dict) -> str:
        # the turn that forks (its own question last), not a follow-up that carries it in its history
        if body["messages"][-1].get("content") == "question one" and not release.is_set():
            if not agent_cached:
                gateway[0].runner._evict_cached_agent(gateway[0].session_key())
            in_reply.set()
            release.wait(20)
            return "first answer"
        return "second answer"

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        gateway.append(gw)
        sid = await _chat_with_history(gw, llm)
        llm.configure(reply_fn=held_answer)
        await gw.send_text("question one")
        assert await asyncio.get_running_loop().run_in_executor(None, in_reply.wait, 20)
        assert await send_while_busy(gw, llm, "question two")  # queued (or interrupting)
        release.set()
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    (fork,) = _events(runtime, "fork.created")
    child = fork["child_session_id"]
    assert gw.bound_session_id() == child
    # answered from the child's context (0.14 merges an interrupted turn's text into the follow-up)
    answered = [r for r in llm.chat_requests() if "question two" in str(r.body["messages"][-1].get("content"))]
    assert len(answered) == 1 and any(SEED_MARKER in str(m.get("content")) for m in answered[0].body["messages"])
    assert _contents(home, child)[-1] == "second answer" and "second answer" in gw.replies()
    parent = _contents(home, sid)
    assert not any("question two" in c or c == "second answer" for c in parent)  # nothing written to the parent
    assert [r["id"] for r in probe.sessions_table(home / "state.db")] == [sid, child]


def test_gateway_prompt_user_keeps_id_and_routing(handoff: Any, llm: FakeLLMServer, home: Path) -> None:
    runtime = handoff(mode="prompt_user", after_compressions=1)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _chat_with_history(gw, llm)
        llm.configure(reply_text="first answer")
        await gw.send_text("question one")
        await gw.drain()
        llm.configure(reply_text="second answer")
        await gw.send_text("question two")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    assert gw.bound_session_id() == sid and _routing_on_disk(home) == {gw.session_key(): sid}
    assert list(_rows(home)) == [sid] and _rows(home)[sid]["ended_at"] is None
    assert _contents(home, sid)[-4:] == ["question one", "first answer", "question two", "second answer"]
    (packet,) = _packets(home)
    assert any(f"`{packet}`" in r and "/new" in r for r in gw.replies())
    assert gw.replies()[-2:] == ["first answer", "second answer"]
    assert _events(runtime, "handoff.prompted") and not _events(runtime, "fork.created")


def test_gateway_failed_child_creation_keeps_routing_on_the_original_session(
    handoff: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_state import SessionDB

    runtime = handoff(mode="fresh_session", after_compressions=1)
    real_create = SessionDB.create_session

    def refuse_children(self: Any, session_id: str, source: str, **kwargs: Any) -> str:
        if kwargs.get("parent_session_id"):
            raise sqlite3.OperationalError("disk I/O error")
        return real_create(self, session_id, source, **kwargs)

    monkeypatch.setattr(SessionDB, "create_session", refuse_children)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _chat_with_history(gw, llm)
        llm.configure(reply_text="first answer")
        await gw.send_text("question one")
        await gw.drain()
        llm.configure(reply_text="second answer")
        await gw.send_text("question two")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    assert gw.bound_session_id() == sid and _routing_on_disk(home) == {gw.session_key(): sid}
    assert list(_rows(home)) == [sid]
    assert _contents(home, sid)[-4:] == ["question one", "first answer", "question two", "second answer"]
    assert gw.replies()[-2:] == ["first answer", "second answer"]
    assert _events(runtime, "handoff.failed") and not _events(runtime, "fork.created")
    assert runtime.store_for(home / "state.db").handoffs(lineage_root=sid) == []


def test_gateway_failed_routing_save_rolls_the_fork_back(
    handoff: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = handoff(mode="fresh_session", after_compressions=1)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _chat_with_history(gw, llm)
        store = gw.runner.session_store
        real_save = store._save

        def save_fails_for_other_sessions() -> None:
            if any(entry.session_id != sid for entry in store._entries.values()):
                raise OSError(28, "No space left on device")
            real_save()

        monkeypatch.setattr(store, "_save", save_fails_for_other_sessions)
        llm.configure(reply_text="first answer")
        await gw.send_text("question one")
        await gw.drain()
        llm.configure(reply_text="second answer")
        await gw.send_text("question two")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    assert gw.bound_session_id() == sid and _routing_on_disk(home) == {gw.session_key(): sid}
    assert list(_rows(home)) == [sid] and _rows(home)[sid]["ended_at"] is None  # the child was removed again
    assert _contents(home, sid)[-4:] == ["question one", "first answer", "question two", "second answer"]
    (failed,) = _events(runtime, "handoff.failed")
    assert failed["stage"] == "routing" and "No space left" in failed["reason"]
    assert runtime.store_for(home / "state.db").handoffs(lineage_root=sid) == []


def test_gateway_hygiene_handoff_tells_the_user_before_the_answer(
    handoff: Any, llm: FakeLLMServer, home: Path
) -> None:
    """Hygiene compacts before the turn, with a throwaway agent that has no status
    channel: the notice is delivered by the gateway-turn seam, ahead of the reply."""
    handoff(mode="fresh_session", after_compressions=1)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        llm.configure(prompt_tokens=126_000)
        await gw.send_text("hi")
        await gw.drain()
        sid = gw.bound_session_id()
        for m in probe.seed_messages(200, tag="hist"):
            gw.runner.session_store.append_to_transcript(sid, m)
        llm.configure(prompt_tokens=None, reply_text="answer after hygiene")
        await gw.send_text("what is the plan?")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    child = gw.bound_session_id()
    assert child != sid and _rows(home)[child]["parent_session_id"] == sid
    replies = gw.replies()
    notice = next(i for i, r in enumerate(replies) if child in r and "hand-off packet" in r)
    assert replies[-1] == "answer after hygiene" and notice < len(replies) - 1
    assert _contents(home, child)[-2:] == ["what is the plan?", "answer after hygiene"]


def test_handoff_packet_slash_command_in_a_gateway_chat(handoff: Any, llm: FakeLLMServer, home: Path) -> None:
    runtime = handoff(mode="fresh_session", after_compressions=3)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        sid = await _chat_with_history(gw, llm, n=6)
        await gw.send_text(f"/handoff-packet keep {SECRETS['github']} out, freeze on Friday")
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())

    (packet,) = _packets(home)
    assert f"`{packet}`" in gw.replies()[-1] and sid in gw.replies()[-1]
    text = packet.read_text(encoding="utf-8")
    assert f"- Session: `{sid}`" in text and "freeze on Friday" in text and SECRETS["github"] not in text
    assert gw.bound_session_id() == sid and list(_rows(home)) == [sid]
    (record,) = runtime.store_for(home / "state.db").handoffs(session_id=sid)
    assert record.mode == "manual" and record.seq is None  # not counted against max_auto_handoffs


@pytest.mark.skipif(not HOST_NATIVE_MODE, reason="turn leases are Hermes 0.20+'s")
def test_a_turn_that_forks_holds_the_childs_turn_lease_until_it_ends(
    handoff: Any, db: Any, llm: FakeLLMServer, home: Path
) -> None:
    """Hermes 0.20+ refuses a turn's transcript write to a conversation whose turn lease
    that turn does not hold, and a hand-off child is a conversation of its own: the turn
    that forks takes the child's lease under its own holder (its answer is written in the
    child) and gives it back when it ends, so the child's next turn starts at once."""
    handoff(mode="fresh_session", after_compressions=1)
    agent, history = _seeded_agent(db, llm, "in_place")
    during: list[list[tuple[str, str]]] = []

    def answer(body: dict) -> str:
        during.append(_turn_leases(home))
        return "first answer"

    llm.configure(reply_fn=answer, prompt_tokens=150_000)
    result = agent.run_conversation("question one", conversation_history=history)
    child = agent.session_id
    assert child != SID and result.get("final_response") == "first answer"
    # the turn's model call (a title call may follow the turn) saw the parent's lease (Hermes's) and the child's
    assert max(map(len, during)) == 2
    assert _turn_leases(home) == []  # both given back
    assert _contents(home, child)[-2:] == ["question one", "first answer"]
    llm.configure(reply_fn=None, reply_text="second answer", prompt_tokens=100)
    second = agent.run_conversation("question two", conversation_history=result["messages"])
    assert second.get("final_response") == "second answer" and agent.session_id == child
    assert _contents(home, child)[-2:] == ["question two", "second answer"]
