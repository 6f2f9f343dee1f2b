"""Drive the real Hermes ``GatewayRunner`` in-process with a fake platform adapter.

The one gateway harness: the selftest probe, the integration tests and the scripts
(benchmarks, fixture making) all start their gateway here. Import only after
``HERMES_HOME`` is set (Hermes reads it at import time).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from ..fail_open import failing_open


def _imports() -> Any:
    from gateway.config import GatewayConfig, Platform, PlatformConfig
    from gateway.platforms.base import BasePlatformAdapter, MessageEvent, SendResult
    from gateway.session import SessionSource, build_session_key

    return GatewayConfig, Platform, PlatformConfig, BasePlatformAdapter, MessageEvent, SendResult, SessionSource, \
        build_session_key


def make_adapter_class(record_edits: bool = False) -> type:
    """A fake Telegram adapter class; with ``record_edits`` it also supports (and records)
    ``edit_message``, as platforms that stream replies by editing do."""
    _, Platform, PlatformConfig, BasePlatformAdapter, _, SendResult, _, _ = _imports()

    class FakeAdapter(BasePlatformAdapter):  # type: ignore[misc, valid-type]
        """A platform that records what the gateway sends (``sent``: chat and text) and
        everything it delivers (``delivered``: sent and edited texts, in order)."""

        def __init__(self) -> None:
            super().__init__(PlatformConfig(enabled=True), Platform.TELEGRAM)
            self.sent: list[tuple[str, str]] = []
            self.delivered: list[str] = []

        async def connect(self, **_: Any) -> bool:
            self._mark_connected()
            return True

        async def disconnect(self) -> None:
            self._mark_disconnected()

        async def send(self, chat_id: str, content: str, reply_to: Any = None, metadata: Any = None,
                       **_: Any) -> Any:
            self.sent.append((chat_id, content))
            self.delivered.append(content)
            return SendResult(success=True, message_id=str(len(self.sent)))

        async def send_typing(self, chat_id: str, metadata: Any = None) -> None:
            return None

        async def get_chat_info(self, chat_id: str) -> dict[str, Any]:
            return {"name": "test chat", "type": "dm"}

    if not record_edits:
        return FakeAdapter

    class EditingAdapter(FakeAdapter):
        async def edit_message(self, chat_id: str, message_id: str, content: str, **_: Any) -> Any:
            self.delivered.append(content)
            return SendResult(success=True, message_id=message_id)

    return EditingAdapter


@dataclass
class GatewayHarness:
    runner: Any
    adapter: Any
    chat_id: str = "42"
    _ids: int = field(default=0)

    def source(self, user_id: str = "u1", user_name: str = "alice", chat_id: str | None = None,
               chat_type: str = "dm", thread_id: str | None = None) -> Any:
        """A sender. Users in one ``dm`` chat, or in one ``thread_id`` of a group, share a session."""
        _, Platform, *_, SessionSource, _ = _imports()
        return SessionSource(platform=Platform.TELEGRAM, chat_id=chat_id or self.chat_id, chat_type=chat_type,
                             user_id=user_id, user_name=user_name, thread_id=thread_id)

    def session_key(self, source: Any | None = None) -> str:
        *_, build_session_key = _imports()
        return str(build_session_key(source or self.source()))

    def bound_session_id(self, source: Any | None = None) -> str | None:
        entry = self.runner.session_store._entries.get(self.session_key(source))
        return entry.session_id if entry else None

    def event(self, text: str, source: Any | None = None) -> Any:
        """A MessageEvent as a platform would deliver it (fresh message id)."""
        _, _, _, _, MessageEvent, *_ = _imports()
        self._ids += 1
        return MessageEvent(text=text, source=source or self.source(), message_id=str(self._ids))

    async def send_text(self, text: str, source: Any | None = None) -> None:
        await self.adapter.handle_message(self.event(text, source))

    async def say(self, text: str, source: Any | None = None, timeout: float = 60.0) -> None:
        """Send ``text`` and wait until the gateway has handled it (and what it spawned)."""
        await self.send_text(text, source)
        await self.drain(timeout)

    def chat(self, chat_id: str) -> Any:
        """The operator's sender in DM chat ``chat_id`` (one session per chat)."""
        return self.source(user_id="42", user_name="operator", chat_id=chat_id)

    def _tasks(self) -> list[Any]:
        tasks = list(self.adapter._background_tasks)
        tasks += [t for t in getattr(self.runner, "_background_tasks", ()) if isinstance(t, asyncio.Task)]
        return [t for t in tasks if not t.done()]

    async def drain(self, timeout: float = 60.0) -> None:
        """Wait until every background task the adapter and the runner spawned (and re-spawned) ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await asyncio.sleep(0)
        while self._tasks():
            if loop.time() > deadline:
                raise TimeoutError("gateway tasks still running")
            await asyncio.wait(self._tasks(), timeout=max(0.1, deadline - loop.time()))
            await asyncio.sleep(0)
        await asyncio.sleep(0)

    def replies(self) -> list[str]:
        return [content for _, content in self.adapter.sent]


async def start_gateway(record_edits: bool = False, resume_interrupted: bool = True) -> GatewayHarness:
    """A ``GatewayRunner`` wired to one fake Telegram adapter, as ``start()`` wires adapters
    (``record_edits``: see :func:`make_adapter_class`; ``resume_interrupted=False`` skips
    ``start()``'s resuming of restart-interrupted sessions)."""
    GatewayConfig, Platform, PlatformConfig, *_ = _imports()
    import gateway.config as gateway_config

    os.environ.setdefault("GATEWAY_ALLOW_ALL_USERS", "true")
    import gateway.run as gr
    import hermes_state
    from hermes_constants import get_hermes_home

    # Both are computed once at import; a probe or test switches HERMES_HOME later.
    gr._hermes_home = get_hermes_home()
    hermes_state.DEFAULT_DB_PATH = get_hermes_home() / "state.db"
    # never Hermes's default daily (04:00) / 24 h idle session reset: a session made earlier
    # (a fixture, a seeded transcript) must keep its routing (0.21+ has no automatic reset)
    reset_policy = getattr(gateway_config, "SessionResetPolicy", None)
    reset = {"default_reset_policy": reset_policy(mode="none")} if reset_policy is not None else {}
    config = GatewayConfig(platforms={Platform.TELEGRAM: PlatformConfig(enabled=True)}, **reset)
    runner = gr.GatewayRunner(config)
    adapter = make_adapter_class(record_edits)()
    await adapter.connect()
    adapter.set_message_handler(runner._handle_message)
    adapter.set_fatal_error_handler(runner._handle_adapter_fatal_error)
    adapter.set_session_store(runner.session_store)
    adapter.set_busy_session_handler(runner._handle_active_session_busy_message)
    if hasattr(adapter, "set_authorization_check"):
        adapter.set_topic_recovery_fn(runner._recover_telegram_topic_thread_id)
        adapter.set_authorization_check(runner._make_adapter_auth_check(adapter.platform))
        adapter._busy_text_mode = runner._busy_text_mode
    runner.adapters[Platform.TELEGRAM] = adapter
    runner._gateway_loop = asyncio.get_running_loop()
    # start() resumes restart-interrupted sessions once adapters are connected.
    if resume_interrupted:
        runner._schedule_resume_pending_sessions()
    return GatewayHarness(runner=runner, adapter=adapter)


BUFFER_CHECK = "message buffered during compression delivered"


def check_buffered_delivery(result: Any, llm: Any, runtime: Any) -> bool:
    """Selftest check: through the real GatewayRunner, a message that arrives while the
    session compresses is buffered, then answered after the triggering message, on the
    same session id. ``result`` is a ProbeResult; ``llm`` the running FakeLLMServer."""
    import threading

    from .. import host
    from ..inbox.repository import DELIVERED, Inbox
    from .seeds import seed_messages

    def reply(body: dict[str, Any]) -> str:
        users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
        return "re: " + str(users[-1].get("content") if users else "")

    async def scenario() -> tuple[GatewayHarness, str]:
        gw = await start_gateway()
        await gw.send_text("hi")
        await gw.drain()
        sid = gw.bound_session_id() or ""
        for m in seed_messages(tag="probe"):
            gw.runner.session_store.append_to_transcript(sid, m)
        gate = threading.Event()
        llm.configure(reply_fn=reply, summary_gate=gate, gate_timeout=30.0)
        try:
            await gw.send_text("probe trigger")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while runtime.compressing.op_for(sid) is None and loop.time() < deadline:
                await asyncio.sleep(0.01)
            await gw.send_text("probe follow-up")
        finally:
            gate.set()
        await gw.drain()
        return gw, sid

    try:
        with failing_open("the gateway buffering scenario", "the check fails", level=None) as failed:
            gw, sid = asyncio.run(scenario())
        if failed:
            return bool(result.check(BUFFER_CHECK, False, failed.reason))
    finally:
        llm.configure(reply_fn=None, summary_gate=None)
    answers = [r for r in gw.replies() if r.startswith("re: ")]
    entries = Inbox(runtime.store_for(host.runner_db_path(gw.runner))).entries()
    ok = (
        answers == ["re: probe trigger", "re: probe follow-up"]
        and [(e.text, e.state) for e in entries] == [("probe follow-up", DELIVERED)]
        and gw.bound_session_id() == sid
    )
    detail = f"answers={answers} inbox={[(e.text, e.state) for e in entries]} bound={gw.bound_session_id()} sid={sid}"
    return bool(result.check(BUFFER_CHECK, ok, detail))
