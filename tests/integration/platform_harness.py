"""The real ``GatewayRunner`` in-process with one fake platform adapter that records
everything the gateway delivers (``send`` and ``edit_message``)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any


def make_adapter_class() -> type:
    from gateway.config import Platform, PlatformConfig
    from gateway.platforms.base import BasePlatformAdapter, SendResult

    class RecordingAdapter(BasePlatformAdapter):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(PlatformConfig(enabled=True), Platform.TELEGRAM)
            self.delivered: list[str] = []

        async def connect(self, **_: Any) -> bool:
            self._mark_connected()
            return True

        async def disconnect(self) -> None:
            self._mark_disconnected()

        async def send(self, chat_id: str, content: str, reply_to: Any = None, metadata: Any = None,
                       **_: Any) -> Any:
            self.delivered.append(content)
            return SendResult(success=True, message_id=str(len(self.delivered)))

        async def edit_message(self, chat_id: str, message_id: str, content: str, **_: Any) -> Any:
            self.delivered.append(content)
            return SendResult(success=True, message_id=message_id)

        async def send_typing(self, chat_id: str, metadata: Any = None) -> None:
            return None

        async def get_chat_info(self, chat_id: str) -> dict[str, Any]:
            return {"name": "test chat", "type": "dm"}

    return RecordingAdapter


@dataclass
class Gateway:
    runner: Any
    adapter: Any
    chat_id: str = "42"
    _ids: int = field(default=0)

    def source(self) -> Any:
        from gateway.config import Platform
        from gateway.session import SessionSource

        return SessionSource(platform=Platform.TELEGRAM, chat_id=self.chat_id, chat_type="dm", user_id="u1",
                             user_name="alice")

    def session_id(self) -> str | None:
        from gateway.session import build_session_key

        entry = self.runner.session_store._entries.get(build_session_key(self.source()))
        return entry.session_id if entry else None

    async def say(self, text: str, timeout: float = 60.0) -> None:
        from gateway.platforms.base import MessageEvent

        self._ids += 1
        await self.adapter.handle_message(MessageEvent(text=text, source=self.source(), message_id=str(self._ids)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.adapter._background_tasks:
            if loop.time() > deadline:
                raise TimeoutError("gateway tasks still running")
            await asyncio.wait(list(self.adapter._background_tasks), timeout=max(0.1, deadline - loop.time()))
        await asyncio.sleep(0)


async def start_gateway() -> Gateway:
    """A ``GatewayRunner`` wired to one recording Telegram adapter, as ``start()`` wires adapters."""
    from gateway.config import GatewayConfig, Platform, PlatformConfig, SessionResetPolicy

    os.environ.setdefault("GATEWAY_ALLOW_ALL_USERS", "true")
    import gateway.run as gr
    import hermes_state
    from hermes_constants import get_hermes_home

    # Both are computed once at import; tests switch HERMES_HOME per test.
    gr._hermes_home = get_hermes_home()
    hermes_state.DEFAULT_DB_PATH = get_hermes_home() / "state.db"
    # never Hermes's default daily (04:00) / 24 h idle session reset: a session made earlier
    # (a fixture, a seeded transcript) must keep its routing
    config = GatewayConfig(platforms={Platform.TELEGRAM: PlatformConfig(enabled=True)},
                           default_reset_policy=SessionResetPolicy(mode="none"))
    runner = gr.GatewayRunner(config)
    adapter = make_adapter_class()()
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
    return Gateway(runner=runner, adapter=adapter)
