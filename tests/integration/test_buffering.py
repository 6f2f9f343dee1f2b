"""Messages that arrive while the real GatewayRunner compresses a session: buffered
durably, answered in arrival order on the same live session id, replayed once after
a restart. Compression is triggered by session hygiene (before the turn) or by
preflight (inside the agent's turn); the fake LLM holds the summary call open while
follow-ups arrive."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.config import GuardConfig
from hermes_session_guard.inbox.repository import DELIVERED, Inbox
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.gateway import GatewayHarness, start_gateway

from ..fake_llm import ScriptedLLMServer
from .conftest import HOST_HAS_IN_PLACE, HOST_ROW, MODE_PARAMS
from .waiting import parked_in, place

# Hermes's compression, guarded or not: AIAgent._compress_context (0.13-0.19), or the
# conversation_compression function it calls (0.20+), on any thread's stack.
_IN_COMPRESSION = [place("_compress_context"), place("compress_context")]

# The reproductions without the guard need a host that rotates on every compression and
# interrupts the agent for a message that arrives meanwhile (0.13-0.16 keep one pending
# slot, 0.17 a FIFO of 32: both lose or misroute messages). From 0.18 the host compacts
# in place and demotes interrupt to queue while it compresses, so most of them no longer
# happen there; the guard's own tests below run on every release.
HOST_ROTATES = HOST_ROW is not None and not HOST_HAS_IN_PLACE
ON_ROTATING_HOSTS = pytest.mark.skipif(
    not HOST_ROTATES, reason="reproduces the busy handling of hosts that rotate on compression (0.13-0.17); "
    "0.18+ compacts in place and queues messages while it compresses")
# Hermes's own compression_locks exist (0.16+): the lease a compression elsewhere holds.
NATIVE_LOCK = HOST_ROW is not None and HOST_ROW.behaviour.lock == "native"

MARK = re.compile(r"\b(?:trigger|msg-\d+|question|bob-\d+)\b")
HISTORY = {"hygiene": (200, 126_000), "preflight": (48, 500)}


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def echo(body: dict[str, Any]) -> str:
    """The fake model answers 're: <marker of the latest user message>'."""
    found = MARK.findall(last_user_text(body))
    return "re: " + (found[-1] if found else "?")


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def buffer_config(guard: Any) -> Iterator[Callable[..., None]]:
    """Change ``session_guard.buffer`` options for one test."""
    before = guard.config

    def configure(**options: Any) -> None:
        guard.config = replace(before, buffer=replace(before.buffer, **options))

    yield configure
    guard.config = before


def _set_mode(home: Path, llm: ScriptedLLMServer, mode: str) -> None:
    if mode == "in_place" or HOST_HAS_IN_PLACE:
        probe.write_config(home, llm.base_url, in_place=(mode == "in_place"))


async def _open_session(gw: GatewayHarness, llm: ScriptedLLMServer, trigger: str, source: Any, tag: str) -> str:
    """A chat whose history (messages ``<tag>-<i>: ...``) makes the next message compress
    (by ``trigger``)."""
    n, tokens = HISTORY[trigger]
    llm.configure(prompt_tokens=tokens)
    await gw.send_text("hi", source=source)
    await gw.drain()
    sid = gw.bound_session_id(source)
    assert sid
    for m in probe.seed_messages(n, tag=tag):
        gw.runner.session_store.append_to_transcript(sid, m)
    llm.configure(prompt_tokens=None)
    return sid


def new_tag() -> str:
    return "h" + uuid.uuid4().hex[:8]


async def _summary_started(llm: ScriptedLLMServer, tag: str, since: float, timeout: float = 30.0) -> None:
    """Wait until the summary call for this session's history has reached the fake LLM
    (a summary request from another test's leftover thread does not count)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(r.ts >= since and f"{tag}-1:" in json.dumps(r.body) for r in llm.summary_requests()):
        assert loop.time() < deadline, "the summary call never started"
        await asyncio.sleep(0.01)


@dataclass
class Observed:
    gw: GatewayHarness
    sid: str
    sent: list[str]
    home: Path
    llm: ScriptedLLMServer
    sources: list[Any] = field(default_factory=list)
    tag: str = "hist"

    def answers(self) -> list[str]:
        return [r for r in self.gw.replies() if r.startswith("re: ")]

    def live(self) -> list[str]:
        return [str(r["content"]) for r in probe.live_messages(self.home / "state.db", self.sid)]


async def _followups_during_compression(llm: ScriptedLLMServer, home: Path, trigger: str, n: int,
                                        users: int) -> Observed:
    gw = await start_gateway()
    group = users > 1
    sources = [
        gw.source(user_id=f"u{i}", user_name=f"user{i}", chat_type="group" if group else "dm",
                  thread_id="t1" if group else None)
        for i in range(max(users, 1))
    ]
    tag = new_tag()
    sid = await _open_session(gw, llm, trigger, sources[0], tag)
    gate = threading.Event()
    llm.configure(reply_fn=echo, summary_gate=gate)
    since = time.time()
    await gw.send_text("trigger", source=sources[0])
    await _summary_started(llm, tag, since)
    sent = []
    for k in range(n):
        text = f"msg-{k}"
        sent.append(text)
        await gw.send_text(text, source=sources[k % len(sources)])
    gate.set()
    # every follow-up is a turn of its own (a few seconds each on 0.20+ under load): a bound, not a measure
    await gw.drain(timeout=max(60.0, 4.0 * n))
    return Observed(gw, sid, sent, home, llm, sources, tag)


def assert_delivered_in_order(obs: Observed) -> None:
    """The contract for follow-ups that arrived during compression."""
    expected = ["re: trigger"] + [f"re: {t}" for t in obs.sent]
    assert obs.answers() == expected, obs.gw.replies()
    src = obs.sources[0] if obs.sources else None
    assert obs.gw.bound_session_id(src) == obs.sid
    rows = probe.sessions_table(obs.home / "state.db")
    assert [(r["id"], r["ended_at"]) for r in rows] == [(obs.sid, None)]
    live = obs.live()
    tail = [MARK.findall(c)[-1] for c in live if MARK.findall(c)]
    assert tail[-2 * (len(obs.sent) + 1):] == [x for t in ["trigger", *obs.sent] for x in (t, t)], tail[-12:]
    # The first turn after compression that carries a buffered message sees the compacted
    # history of the same session, the triggering exchange, and every earlier follow-up.
    for k, text in enumerate(obs.sent):
        (req,) = [r for r in obs.llm.chat_requests() if MARK.findall(last_user_text(r.body))[-1:] == [text]]
        seen = " ".join(str(m.get("content")) for m in req.body["messages"])
        assert "re: trigger" in seen and all(t in seen for t in obs.sent[: k + 1]), text
        assert f"{obs.tag}-100:" not in seen


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize(
    "trigger,n,users",
    [
        ("preflight", 1, 1),
        ("hygiene", 5, 1),
        pytest.param("preflight", 50, 1, marks=pytest.mark.slow),
        ("preflight", 5, 3),
        pytest.param("hygiene", 50, 3, marks=pytest.mark.slow),
    ],
)
def test_followups_during_compression_are_answered_in_order(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str, trigger: str, n: int, users: int
) -> None:
    """Seed scenario 'Post-compression message delivery' with 1, 5 and 50 follow-ups
    from one sender and from several senders sharing one session (a group thread)."""
    _set_mode(home, llm, mode)
    obs = run(_followups_during_compression(llm, home, trigger, n, users))
    assert_delivered_in_order(obs)
    receipts = [r for r in obs.gw.replies() if r == GuardConfig().buffer.receipt_text]
    assert len(receipts) == n
    store = guard.store_for(home / "state.db")
    (op,) = [c["op_id"] for c in store.compressions(obs.sid)]
    entries = Inbox(store).entries()
    assert [(e.state, e.position, e.op_id, e.text) for e in entries] == [
        (DELIVERED, k + 1, op, t) for k, t in enumerate(obs.sent)
    ]
    events = [e for e in audit.read_events(guard.audit_path) if e["event"].startswith("message.")]
    for name in ("message.buffered", "message.delivered"):
        got = [(e["op_id"], e["position"], e["session_id"]) for e in events if e["event"] == name]
        assert got == [(op, k + 1, obs.sid) for k in range(n)], name


@ON_ROTATING_HOSTS
@pytest.mark.parametrize(
    "trigger,n,users", [("preflight", 1, 1), ("hygiene", 5, 1), ("preflight", 50, 1), ("preflight", 5, 3),
                        ("hygiene", 50, 3)],
)
def test_followups_during_compression_are_lost_without_the_guard(
    no_guard: None, llm: ScriptedLLMServer, home: Path, trigger: str, n: int, users: int
) -> None:
    obs = run(_followups_during_compression(llm, home, trigger, n, users))
    with pytest.raises(AssertionError):
        assert_delivered_in_order(obs)


# -- restart / crash ---------------------------------------------------------------------

async def _until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _buffer_then_stop(llm: ScriptedLLMServer, home: Path, n: int) -> tuple[GatewayHarness, str, list[str]]:
    """Runner A: compression held, ``n`` follow-ups arrive, then A stops (its tasks are
    cancelled, as a shutdown or crash leaves them) before the compression ends."""
    gw = await start_gateway()
    tag = new_tag()
    sid = await _open_session(gw, llm, "hygiene", gw.source(), tag)
    gate = threading.Event()
    llm.configure(reply_fn=echo, summary_gate=gate)
    since = time.time()
    await gw.send_text("trigger")
    await _summary_started(llm, tag, since)
    sent = [f"msg-{k}" for k in range(n)]
    for text in sent:
        await gw.send_text(text)
    await gw.adapter.cancel_background_tasks()  # as a gateway shutdown does
    llm.configure(fail_all_summaries=("status", 500))
    gate.set()
    # The orphaned compression ends (failed) before another runner opens the session.
    await _until(lambda: not parked_in(_IN_COMPRESSION), what="the orphaned compression to end")
    llm.configure(fail_all_summaries=None, summary_gate=None)
    return gw, sid, sent


def _assert_replayed_once(gw_b: GatewayHarness, home: Path, sid: str, sent: list[str]) -> None:
    answers = [r for r in gw_b.replies() if r.startswith("re: ")]
    assert answers == [f"re: {t}" for t in sent], gw_b.replies()
    live = [str(r["content"]) for r in probe.live_messages(home / "state.db", sid)]
    for text in sent:
        assert live.count(text) == 1 and live.count(f"re: {text}") == 1, (text, live[-8:])
    assert gw_b.bound_session_id() == sid


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_restart_replays_buffered_messages_once_in_order(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    """A new GatewayRunner on the same HERMES_HOME answers what the previous one had
    buffered, in order, once; a third runner replays nothing."""
    _set_mode(home, llm, mode)

    async def scenario() -> tuple[GatewayHarness, GatewayHarness, str, list[str]]:
        _, sid, sent = await _buffer_then_stop(llm, home, 3)
        assert [e.state for e in Inbox(guard.store_for(home / "state.db")).entries()] == ["buffered"] * 3
        gw_b = await start_gateway()
        await gw_b.drain()
        gw_c = await start_gateway()
        await gw_c.drain()
        return gw_b, gw_c, sid, sent

    gw_b, gw_c, sid, sent = run(scenario())
    _assert_replayed_once(gw_b, home, sid, sent)
    assert gw_c.replies() == []
    assert {e.state for e in Inbox(guard.store_for(home / "state.db")).entries()} == {DELIVERED}
    replayed = [e for e in audit.read_events(guard.audit_path) if e["event"] == "message.replayed"]
    assert len(replayed) == 1 and replayed[0]["waiting"] == 3


@ON_ROTATING_HOSTS
def test_restart_loses_buffered_messages_without_the_guard(no_guard: None, llm: ScriptedLLMServer, home: Path) -> None:
    async def scenario() -> tuple[GatewayHarness, str, list[str]]:
        _, sid, sent = await _buffer_then_stop(llm, home, 3)
        gw_b = await start_gateway()
        await gw_b.drain()
        return gw_b, sid, sent

    gw_b, sid, sent = run(scenario())
    with pytest.raises(AssertionError):
        _assert_replayed_once(gw_b, home, sid, sent)


_CRASHING_GATEWAY = r"""
import asyncio, os, sys, time
from hermes_session_guard.selftest import probe
probe.discover_guard()
import hermes_session_guard
from hermes_session_guard.inbox.repository import Inbox
from hermes_session_guard.selftest.gateway import start_gateway

async def main():
    runtime = hermes_session_guard.current_runtime()
    gw = await start_gateway()
    await gw.send_text("hi")
    await gw.drain()
    sid = gw.bound_session_id()
    for m in probe.seed_messages(200, tag=sys.argv[1]):
        gw.runner.session_store.append_to_transcript(sid, m)
    print("SID", sid, flush=True)
    sys.stdin.readline()  # the parent holds the summary call, then says go
    asyncio.get_running_loop().create_task(gw.send_text("trigger"))
    while runtime.compressing.op_for(sid) is None:
        await asyncio.sleep(0.01)
    for k in range(3):
        await gw.send_text(f"msg-{k}")
    inbox = Inbox(runtime.store_for(probe.Path(os.environ["HERMES_HOME"]) / "state.db"))
    assert len(inbox.entries()) == 3
    print("BUFFERED", flush=True)
    os._exit(1)  # crash: no shutdown, no cleanup, the compression never finishes

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_crash_mid_compression_replays_buffered_messages_once(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    """A gateway process dies (os._exit) while compressing with three messages
    buffered; the next gateway on the same HERMES_HOME answers them, in order, once."""
    import os
    import subprocess
    import sys

    _set_mode(home, llm, mode)
    tag = new_tag()
    gate = threading.Event()
    llm.configure(prompt_tokens=126_000, reply_fn=echo)
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING_GATEWAY, tag], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.startswith("SID "), line
        sid = line.split()[1]
        llm.configure(prompt_tokens=None, summary_gate=gate)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "BUFFERED"
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        llm.configure(summary_gate=None)
        gate.set()

    async def scenario() -> GatewayHarness:
        gw_b = await start_gateway()
        await gw_b.drain()
        return gw_b

    gw_b = run(scenario())
    sent = [f"msg-{k}" for k in range(3)]
    answers = [r for r in gw_b.replies() if r.startswith("re: ")]
    assert answers[-3:] == [f"re: {t}" for t in sent], gw_b.replies()
    live = [str(r["content"]) for r in probe.live_messages(home / "state.db", sid)]
    assert [live.count(t) for t in sent] == [1, 1, 1]
    assert {e.state for e in Inbox(guard.store_for(home / "state.db")).entries()} == {DELIVERED}
    assert gw_b.bound_session_id() == sid


# -- the seed's two-agent loop -----------------------------------------------------------

async def _two_agent_loop(llm: ScriptedLLMServer, home: Path) -> tuple[GatewayHarness, str, list[str]]:
    """Agent A serves a shared thread. Alice force-compresses it (/compress) while bot B
    keeps posting status reports, each time waiting briefly for A's reply before the next."""
    gw = await start_gateway()
    alice = gw.source(user_id="alice", user_name="alice", chat_type="group", thread_id="coord")
    bob = gw.source(user_id="bot-b", user_name="bob", chat_type="group", thread_id="coord")
    tag = new_tag()
    sid = await _open_session(gw, llm, "preflight", alice, tag)
    gate = threading.Event()
    llm.configure(reply_fn=echo, summary_gate=gate)
    since = time.time()
    compress = asyncio.get_running_loop().create_task(gw.send_text("/compress", source=alice))
    await _summary_started(llm, tag, since)
    sent = []
    for k in range(1, 4):
        text = f"bob-{k}"
        sent.append(text)
        before = len(gw.replies())
        await gw.send_text(f"{text}: build {k} is green", source=bob)
        try:
            await _until(lambda before=before: len(gw.replies()) > before, timeout=1.0)
        except AssertionError:
            pass  # no reply from A this time; B sends the next report anyway
    gate.set()
    await compress
    await gw.drain()
    llm.configure(reply_fn=echo)
    await gw.send_text("question: what did bob report?", source=alice)
    await gw.drain()
    return gw, sid, sent


def _assert_a_saw_b(gw: GatewayHarness, llm: ScriptedLLMServer, sid: str, sent: list[str]) -> None:
    answers = [r for r in gw.replies() if r.startswith("re: ")]
    assert answers == [f"re: {t}" for t in sent] + ["re: question"], gw.replies()
    # A's first turn after the compression is bob's first report, in the compacted session
    (first,) = [r for r in llm.chat_requests() if "bob-1" in last_user_text(r.body)]
    assert any("CONTEXT COMPACTION" in str(m.get("content")) or "CONTEXT SUMMARY" in str(m.get("content"))
               for m in first.body["messages"])
    # ... and A's next turn sees every report B sent while A was compressing
    seen = " ".join(str(m.get("content")) for m in llm.chat_requests()[-1].body["messages"])
    assert all(f"{t}: build" in seen for t in sent), seen[-400:]
    assert gw.bound_session_id(gw.source(user_id="alice", user_name="alice", chat_type="group",
                                         thread_id="coord")) == sid


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_two_agent_loop_a_sees_b_messages_after_forced_compression(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str
) -> None:
    """Seed test plan: 'simulated 2-agent loop where A is force-compressed while B is
    sending — assert A's next turn sees B's message'."""
    _set_mode(home, llm, mode)
    gw, sid, sent = run(_two_agent_loop(llm, home))
    _assert_a_saw_b(gw, llm, sid, sent)
    receipts = [r for r in gw.replies() if r == GuardConfig().buffer.receipt_text]
    assert len(receipts) == 3


@ON_ROTATING_HOSTS
def test_two_agent_loop_loses_b_messages_without_the_guard(no_guard: None, llm: ScriptedLLMServer, home: Path) -> None:
    gw, sid, sent = run(_two_agent_loop(llm, home))
    with pytest.raises(AssertionError):
        _assert_a_saw_b(gw, llm, sid, sent)


# -- the gateway's binding stays on the live id on every path ----------------------------

class _NoReuse(OrderedDict):  # type: ignore[type-arg]
    """An agent cache that never hits: every turn builds a fresh AIAgent from the id
    the gateway passes (the queued follow-up recursion passes the turn's original id)."""

    def get(self, key: Any, default: Any = None) -> Any:
        return None


BINDING_PATHS = ["success", "interrupted", "empty_reply", "agent_cache_miss", "followup_recursion"]


async def _binding_path(llm: ScriptedLLMServer, home: Path, path: str) -> tuple[GatewayHarness, str]:
    """A turn that compresses (preflight) and ends by ``path``, then one more message."""
    gw = await start_gateway()
    tag = new_tag()
    sid = await _open_session(gw, llm, "preflight", gw.source(), tag)
    if path == "agent_cache_miss":
        gw.runner._agent_cache = _NoReuse()
    slow = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        last = last_user_text(body)
        if last.endswith("trigger"):
            if path == "interrupted":
                slow.wait(10)
            if path == "empty_reply":
                return ""
        return echo(body)

    gate = threading.Event()
    llm.configure(reply_fn=reply, summary_gate=gate)
    since = time.time()
    turn = asyncio.get_running_loop().create_task(gw.send_text("trigger"))
    await _summary_started(llm, tag, since)
    if path in ("agent_cache_miss", "followup_recursion"):
        for k in range(2):
            await gw.send_text(f"msg-{k}")
    gate.set()
    if path == "interrupted":
        # compression is over and the turn's model call is in progress: a new message interrupts it
        await _until(lambda: any(r.ts >= since and last_user_text(r.body).endswith("trigger")
                                 for r in llm.chat_requests()), what="the turn's model call")
        await gw.send_text("msg-9 interrupting")
        slow.set()
    await turn
    await gw.drain()
    await gw.send_text("question after")
    await gw.drain()
    return gw, sid


def _assert_routing_on_live_id(gw: GatewayHarness, llm: ScriptedLLMServer, home: Path, sid: str) -> None:
    assert gw.bound_session_id() == sid
    rows = probe.sessions_table(home / "state.db")
    assert [(r["id"], r["ended_at"]) for r in rows] == [(sid, None)], [(r["id"], r["end_reason"]) for r in rows]
    rows = probe.live_messages(home / "state.db", sid)
    assert str(rows[-1]["content"]) == "re: question", [str(r["content"])[:30] for r in rows[-6:]]
    users = [str(r["content"]) for r in rows if r["role"] == "user"]
    assert users.count("trigger") == 1, users[-6:]
    assert gw.replies()[-1] == "re: question"
    # the last turn ran on the compacted transcript of the same session
    last = llm.chat_requests()[-1].body
    assert "question after" in last_user_text(last)
    assert any("CONTEXT COMPACTION" in str(m.get("content")) for m in last["messages"])


def _no_empty_reply_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hermes 0.20+ retries an empty reply three times after a 5-20 s backoff (35 s or more
    of sleeping per turn); the path under test is the turn that still ends empty, so the
    backoff is cut to nothing in the module that computes it on this release."""
    import importlib

    # 0.20 binds the name in its turn loop; 0.21+ imports it from retry_utils at each retry
    for name in ("agent.conversation_loop", "agent.retry_utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "jittered_backoff"):
            monkeypatch.setattr(module, "jittered_backoff", lambda *_a, **_k: 0.0)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("path", BINDING_PATHS)
def test_gateway_binding_stays_on_the_live_id(
    guard: Any, llm: ScriptedLLMServer, home: Path, mode: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_mode(home, llm, mode)
    if path == "empty_reply":
        _no_empty_reply_backoff(monkeypatch)
    gw, sid = run(_binding_path(llm, home, path))
    _assert_routing_on_live_id(gw, llm, home, sid)


@ON_ROTATING_HOSTS
@pytest.mark.parametrize("path", BINDING_PATHS)
def test_gateway_binding_leaves_the_live_id_without_the_guard(
    no_guard: None, llm: ScriptedLLMServer, home: Path, path: str
) -> None:
    gw, sid = run(_binding_path(llm, home, path))
    with pytest.raises(AssertionError):
        _assert_routing_on_live_id(gw, llm, home, sid)


# -- receipts, the operator's cap, failing open ------------------------------------------

async def _compressing_then(llm: ScriptedLLMServer, home: Path, during: Callable[[GatewayHarness], Awaitable[Any]]
                            ) -> tuple[GatewayHarness, str]:
    """Hygiene compression held open while ``during(gw)`` runs; then everything drains."""
    gw = await start_gateway()
    tag = new_tag()
    sid = await _open_session(gw, llm, "hygiene", gw.source(), tag)
    gate = threading.Event()
    llm.configure(reply_fn=echo, summary_gate=gate)
    since = time.time()
    await gw.send_text("trigger")
    await _summary_started(llm, tag, since)
    await during(gw)
    gate.set()
    await gw.drain()
    return gw, sid


def test_over_the_cap_is_refused_to_the_sender_and_logged(
    guard: Any, buffer_config: Callable[..., None], llm: ScriptedLLMServer, home: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``buffer.max_messages`` caps the buffer; a message over it is refused loudly
    (told to the sender, audit event, WARNING line), never dropped in silence."""
    buffer_config(max_messages=2)

    async def during(gw: GatewayHarness) -> None:
        for k in range(4):
            await gw.send_text(f"msg-{k}")

    with caplog.at_level("WARNING", logger="hermes_session_guard"):
        gw, sid = run(_compressing_then(llm, home, during))
    receipt = GuardConfig().buffer.receipt_text
    refusal = GuardConfig().buffer.overflow_text.format(waiting=2, limit=2)
    notices = [r for r in gw.replies() if r in (receipt, refusal)]
    assert notices == [receipt, receipt, refusal, refusal]
    assert [r for r in gw.replies() if r.startswith("re: ")] == ["re: trigger", "re: msg-0", "re: msg-1"]
    refused = [e for e in audit.read_events(guard.audit_path) if e["event"] == "message.refused"]
    assert [(e["waiting"], e["limit"], e["session_id"]) for e in refused] == [(2, 2, sid), (2, 2, sid)]
    assert sum("REFUSED" in r.getMessage() for r in caplog.records) == 2


def test_receipt_is_sent_only_after_the_message_is_stored(
    guard: Any, llm: ScriptedLLMServer, home: Path
) -> None:
    stored_when_receipted: list[list[str]] = []

    async def during(gw: GatewayHarness) -> None:
        send = gw.adapter.send
        inbox = Inbox(guard.store_for(home / "state.db"))

        async def watching_send(chat_id: str, content: str, *args: Any, **kwargs: Any) -> Any:
            if content == GuardConfig().buffer.receipt_text:
                stored_when_receipted.append([e.text or "" for e in inbox.entries()])
            return await send(chat_id, content, *args, **kwargs)

        gw.adapter.send = watching_send
        for k in range(3):
            await gw.send_text(f"msg-{k}")

    run(_compressing_then(llm, home, during))
    assert stored_when_receipted == [["msg-0"], ["msg-0", "msg-1"], ["msg-0", "msg-1", "msg-2"]]


def test_receipts_can_be_switched_off(guard: Any, buffer_config: Callable[..., None], llm: ScriptedLLMServer,
                                      home: Path) -> None:
    buffer_config(receipt=False)

    async def during(gw: GatewayHarness) -> None:
        for k in range(2):
            await gw.send_text(f"msg-{k}")

    gw, _ = run(_compressing_then(llm, home, during))
    assert GuardConfig().buffer.receipt_text not in gw.replies()
    assert [r for r in gw.replies() if r.startswith("re: ")] == ["re: trigger", "re: msg-0", "re: msg-1"]


def test_a_store_failure_fails_open_to_hermes(
    guard: Any, llm: ScriptedLLMServer, home: Path, mocker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """If the inbox cannot store the message, Hermes gets it as it would without the
    guard (nothing is dropped by the guard) and one ERROR line says why."""
    import sqlite3

    mocker.patch.object(Inbox, "append", side_effect=sqlite3.OperationalError("disk I/O error"))

    async def during(gw: GatewayHarness) -> None:
        await gw.send_text("msg-0")

    with caplog.at_level("ERROR", logger="hermes_session_guard"):
        gw, _ = run(_compressing_then(llm, home, during))
    assert any("could not store a message" in r.getMessage() and "failing open" in r.getMessage()
               for r in caplog.records)
    assert GuardConfig().buffer.receipt_text not in gw.replies()
    assert "re: msg-0" in gw.replies()


def _lease_elsewhere(home: Path, sid: str, holder: str) -> Callable[[], None]:
    """Hold the session's compression lock as a compression in another process would:
    Hermes's own ``compression_locks`` where the host has it (0.16+, where the guard
    holds that one too), else the guard's ``session_guard_locks``. Returns the release."""
    from hermes_session_guard.store import GuardStore

    if NATIVE_LOCK:
        from hermes_state import SessionDB

        db = SessionDB(home / "state.db")
        assert db.try_acquire_compression_lock(sid, holder, ttl_seconds=300.0)

        def release_native() -> None:
            db.release_compression_lock(sid, holder)
            db.close()

        return release_native
    store = GuardStore(home / "state.db")
    assert store.try_acquire_lease(sid, holder, 300.0)

    def release_guard() -> None:
        store.release_lease(sid, holder)
        store.close()

    return release_guard


def test_a_compression_lease_held_by_another_process_buffers_follow_ups(
    guard: Any, llm: ScriptedLLMServer, home: Path
) -> None:
    """A turn is running here while another process compresses the same session (it
    holds the session's compression lock): a follow-up waits in the inbox behind that
    compression instead of interrupting the turn, then runs after it, in order."""
    # a running pid and no identity fields: nothing proves this holder dead, its lease decides
    holder = f"pid={os.getppid()}:tid=1:guard-op=op-elsewhere:nonce=abc123"
    replying = threading.Event()
    gate = threading.Event()

    def slow(body: dict[str, Any]) -> str:
        if "question" in last_user_text(body):
            replying.set()
            gate.wait(30)
        return echo(body)

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        await gw.send_text("hi")
        await gw.drain()
        sid = gw.bound_session_id()
        assert sid
        release = _lease_elsewhere(home, sid, holder)
        try:
            llm.configure(reply_fn=slow)
            await gw.send_text("question")
            await _until(replying.is_set, what="the turn reached the model")
            await gw.send_text("msg-0")
        finally:
            release()
            gate.set()
        await gw.drain()
        return gw, sid

    gw, sid = run(scenario())
    entries = Inbox(guard.store_for(home / "state.db")).entries()
    assert [(e.text, e.op_id, e.session_id, e.state) for e in entries] == [("msg-0", "op-elsewhere", sid, DELIVERED)]
    assert GuardConfig().buffer.receipt_text in gw.replies()
    assert [r for r in gw.replies() if r.startswith("re: ")] == ["re: question", "re: msg-0"]
    assert gw.bound_session_id() == sid


def test_slash_commands_during_compression_go_to_hermes(guard: Any, llm: ScriptedLLMServer, home: Path) -> None:
    async def during(gw: GatewayHarness) -> None:
        await gw.send_text("/help")

    run(_compressing_then(llm, home, during))
    assert Inbox(guard.store_for(home / "state.db")).entries() == []


def test_selftest_check_for_buffered_delivery(guard: Any, llm: ScriptedLLMServer, home: Path) -> None:
    from hermes_session_guard.selftest.gateway import BUFFER_CHECK, check_buffered_delivery

    result = probe.ProbeResult()
    assert check_buffered_delivery(result, llm, guard), result.checks
    assert [c["name"] for c in result.checks] == [BUFFER_CHECK]


def test_gateway_names_the_guard_uses_exist_in_this_hermes(guard: Any, llm: ScriptedLLMServer, home: Path) -> None:
    """Every gateway name listed in host_names.HOST_NAMES is present on a live runner,
    its session store and its adapter (a new Hermes release that renames one fails here)."""
    from .host_names import HOST_NAMES

    async def scenario() -> GatewayHarness:
        gw = await start_gateway()
        await gw.send_text("hi")
        await gw.drain()
        return gw

    gw = run(scenario())
    owners = {
        "GatewayRunner attributes": gw.runner,
        "SessionStore attributes": gw.runner.session_store,
        "BasePlatformAdapter attributes": gw.adapter,
    }
    if NATIVE_LOCK:
        db = gw.runner._session_db
        owners["SessionDB compression lock, read by the busy-message seam (0.16+)"] = getattr(db, "_db", db)
    missing = [f"{group}: {name}" for group, obj in owners.items() for name in HOST_NAMES[group]
               if not hasattr(obj, name)]
    import importlib

    for module in ("gateway.platforms.base", "gateway.session", "tools.approval"):
        for dotted in HOST_NAMES[module]:
            obj: Any = importlib.import_module(module)
            for part in dotted.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{module}: {dotted}")
    assert missing == []
