"""The real gateway API server (``APIServerAdapter`` on 127.0.0.1) for turn-order tests,
a stdlib HTTP client, and the per-session ordering contract as a list of violations."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.summaries.tags import is_summary_text

API_KEY = "test-key-0123456789abcdef0123456789"
MARK = re.compile(r"^msg-(\d+)-[a-z]+$")


def marker(i: int, tag: str = "burst") -> str:
    return f"msg-{i}-{tag}"


def answer_for(text: str) -> str:
    return f"answer to [{text}]"


# Hermes 0.22 appends a per-turn note to the user message on the wire when a session moves to
# another interface (agent/surface_switch.py); it is Hermes's, not the user's message.
SURFACE_NOTE = "\n\n[System: This conversation is now being answered on a different interface: "


def echo_last_user(body: dict[str, Any]) -> str:
    """The fake model's reply: names the last user message it was given (whole text, without
    Hermes's interface-switch note)."""
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            return answer_for(user_wrote(m))
    return "no user message"


def user_wrote(m: dict[str, Any]) -> str:
    """A user message of a request as the user wrote it (Hermes's interface-switch note cut)."""
    return _text(m).split(SURFACE_NOTE, 1)[0].strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ApiServer:
    base: str
    loop: asyncio.AbstractEventLoop
    adapter: Any


@contextmanager
def running_api_server(home: Path) -> Iterator[ApiServer]:
    """``APIServerAdapter.connect()`` (the aiohttp server the gateway starts) on its own loop."""
    import hermes_state
    from gateway.config import PlatformConfig
    from gateway.platforms.api_server import APIServerAdapter

    hermes_state.DEFAULT_DB_PATH = home / "state.db"
    port = _free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), ready.set(), loop.run_forever()),
                              daemon=True)
    thread.start()
    ready.wait(5)
    adapter = APIServerAdapter(PlatformConfig(enabled=True, extra={"host": "127.0.0.1", "port": port,
                                                                   "key": API_KEY}))
    _anchor_agents(adapter)
    ok = asyncio.run_coroutine_threadsafe(adapter.connect(), loop).result(30)
    assert ok, "the API server did not start"
    try:
        yield ApiServer(f"http://127.0.0.1:{port}", loop, adapter)
    finally:
        try:
            asyncio.run_coroutine_threadsafe(adapter.disconnect(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def _anchor_agents(adapter: Any) -> None:
    """Each agent the server builds resumes its session priced by the provider, as a
    long-lived gateway's agents do (conftest.anchor_on_real_usage; 0.21+ only)."""
    from .conftest import DEFERS_TO_USAGE, anchor_on_real_usage

    create = getattr(adapter, "_create_agent", None)
    if not DEFERS_TO_USAGE or create is None:
        return

    def anchored(*args: Any, **kwargs: Any) -> Any:
        agent = create(*args, **kwargs)
        sid, db = kwargs.get("session_id"), getattr(agent, "_session_db", None)
        if sid and db is not None:
            anchor_on_real_usage(agent, db.get_messages_as_conversation(sid))
        return agent

    adapter._create_agent = anchored


@dataclass
class Reply:
    text: str
    status: int
    session_header: str | None
    body: Any
    retry_after: str | None = None


def post(url: str, payload: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 180) -> Reply:
    data = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, hdrs = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as err:
        raw, status, hdrs = err.read(), err.code, err.headers
    ctype = hdrs.get("Content-Type", "")
    if "text/event-stream" in ctype:
        return _sse_reply(raw.decode(), status, hdrs)
    body = json.loads(raw or b"null")
    text = ""
    if isinstance(body, dict):
        if isinstance(body.get("message"), dict):
            text = str(body["message"].get("content") or "")
        elif body.get("choices"):
            text = str(body["choices"][0]["message"].get("content") or "")
    return Reply(text, status, hdrs.get("X-Hermes-Session-Id"), body, hdrs.get("Retry-After"))


def _sse_reply(raw: str, status: int, hdrs: Any) -> Reply:
    text, events = "", []
    for block in raw.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is None or data == "[DONE]":
            continue
        payload = json.loads(data)
        events.append((name, payload))
        if name == "assistant.completed":
            text = str(payload.get("content") or "")
        elif name is None and isinstance(payload, dict) and payload.get("choices"):
            text += str((payload["choices"][0].get("delta") or {}).get("content") or "")
    return Reply(text, status, hdrs.get("X-Hermes-Session-Id"), events)


def session_chat(srv: ApiServer, sid: str, text: str, *, stream: bool = False) -> Reply:
    path = f"/api/sessions/{sid}/chat" + ("/stream" if stream else "")
    return post(srv.base + path, {"message": text})


def chat_completion(srv: ApiServer, sid: str, text: str, *, stream: bool = False) -> Reply:
    return post(srv.base + "/v1/chat/completions",
                {"model": "fake-model", "stream": stream, "messages": [{"role": "user", "content": text}]},
                headers={"X-Hermes-Session-Id": sid})


def send_staggered(fn: Any, texts: list[str], gap: float = 0.05) -> tuple[list[threading.Thread], dict[str, Reply]]:
    """Send ``texts`` concurrently, ``gap`` apart (that is their arrival order)."""
    replies: dict[str, Reply] = {}
    threads = []
    for text in texts:
        t = threading.Thread(target=lambda text=text: replies.__setitem__(text, fn(text)), daemon=True)
        t.start()
        threads.append(t)
        time.sleep(gap)
    return threads, replies


def _text(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return str(c or "")


def answer_order(texts: list[tuple[Any, str]], stored_at_send: Collection[str]) -> list[tuple[Any, str]]:
    """``texts`` (role, text) with each prompt of ``stored_at_send`` moved to right before its
    own answer. Hermes 0.21+'s TUI writes a prompt the moment it is sent (upstream #111868),
    before the turn it then waits for has stored its answer: that row sits where the prompt
    arrived, compaction or not. Its turn still waits and answers it after the other."""
    if not stored_at_send:
        return texts
    out = [t for t in texts if not (t[0] == "user" and t[1] in stored_at_send)]
    for prompt in stored_at_send:
        if ("user", prompt) not in texts:
            continue  # reported below as not live
        answer = ("assistant", answer_for(prompt))
        out.insert(out.index(answer) if answer in out else len(out), ("user", prompt))
    return out


def contract_violations(db: Any, sid: str, sent: list[str], replies: dict[str, Reply], llm: FakeLLMServer,
                        *, compressed: bool, head_text: str | None = None,
                        stored_at_send: Collection[str] = ()) -> list[str]:
    """Everything wrong with ``sid`` after ``sent`` (in arrival order) got ``replies``.
    ``stored_at_send``: prompts the entry point stores when they are sent (:func:`answer_order`)."""
    problems: list[str] = []
    for text in sent:
        r = replies.get(text)
        if r is None:
            problems.append(f"{text}: no reply")
            continue
        if r.status != 200:
            problems.append(f"{text}: HTTP {r.status}")
        if r.text.strip() != answer_for(text):
            problems.append(f"{text}: answered {r.text[:80]!r}")
        if r.session_header not in (None, sid):
            problems.append(f"{text}: X-Hermes-Session-Id {r.session_header}")
        if isinstance(r.body, dict) and r.body.get("session_id") not in (None, sid):
            problems.append(f"{text}: session_id {r.body.get('session_id')}")
    # what the model was asked: one request per message, never merged, after compression on the summary
    asked: dict[str, list[bool]] = {}
    for rec in llm.chat_requests():
        msgs = rec.body.get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        if not users:
            continue
        last = user_wrote(users[-1])
        hits = [t for t in sent if t in last]
        if len(hits) > 1 or (hits and last != hits[0]):
            problems.append(f"model got a merged prompt {last[:120]!r}")
        if hits:
            asked.setdefault(hits[0], []).append(any(is_summary_text(_text(m)) for m in msgs))
    for i, text in enumerate(sent):
        if text not in asked:
            problems.append(f"{text}: never asked")
        elif compressed and i > 0 and not all(asked[text]):
            problems.append(f"{text}: answered from the pre-compression transcript")
    # the live transcript: each message once, in arrival order, followed by its own answer
    live = db.get_messages_as_conversation(sid)
    stored = [(m.get("role"), _text(m).strip()) for m in live]
    texts = answer_order(stored, stored_at_send)
    for prompt in stored_at_send:
        if ("user", prompt) in stored and ("assistant", answer_for(prompt)) in stored \
                and stored.index(("user", prompt)) > stored.index(("assistant", answer_for(prompt))):
            problems.append(f"{prompt}: stored after its own answer")
    summaries = [t for _, t in texts if is_summary_text(t)]
    if compressed and len(summaries) != 1:
        problems.append(f"{len(summaries)} live summaries")
    users = [t for role, t in texts if role == "user" and t in sent]
    if users != sent:
        problems.append(f"live user messages {users} != sent {sent}")
    for i, (role, t) in enumerate(texts):
        if role == "user" and t in sent:
            following = [x for x in texts[i + 1:] if x[0] in ("user", "assistant")][:1]
            if not following or following[0] != ("assistant", answer_for(t)):
                problems.append(f"{t}: followed by {following[:1]}")
    for a, b in zip(texts, texts[1:], strict=False):
        if a[0] == b[0] == "assistant":
            problems.append("two assistant messages in a row")
            break
    if head_text is not None and not any(t.startswith(head_text) for _, t in texts[:3]):
        problems.append("protected head lost")
    return problems
