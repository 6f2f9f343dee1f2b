"""The gateway's routing of chats to sessions: the live ``GatewayRunner`` of this
process, moving its session keys to a hand-off child, and which conversation a plugin
slash command was typed in."""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from ..fail_open import failing_open


def live_gateway_runner() -> Any:
    """The ``GatewayRunner`` of this process, if a gateway runs here (never imports it)."""
    module = sys.modules.get("gateway.run")
    ref = getattr(module, "_gateway_runner_ref", None) if module is not None else None
    with failing_open("the gateway runner reference", "no gateway is taken to run here", level=logging.DEBUG,
                      advice=None):
        return ref() if callable(ref) else None
    return None


def gateway_routes_to(session_id: str) -> bool:
    """True when a gateway chat in this process is bound to ``session_id``."""
    runner = live_gateway_runner()
    store = getattr(runner, "session_store", None) if runner is not None else None
    entries = getattr(store, "_entries", None) if store is not None else None
    if not entries:
        return False
    with getattr(store, "_lock", None) or nullcontext():
        return any(getattr(entry, "session_id", None) == session_id for entry in entries.values())


@dataclass
class RoutingMove:
    keys: list[str]
    undo: Callable[[], None]


def move_gateway_routing(parent: str, child: str) -> RoutingMove | None:
    """Point every gateway session key bound to ``parent`` at ``child`` and persist
    the routing index (sessions.json; 0.19 also its ``gateway_routing`` table), under
    the store's own lock. ``None`` when no gateway runs in this process. On a failed
    save the in-memory binding is restored before the error propagates."""
    runner = live_gateway_runner()
    store = getattr(runner, "session_store", None) if runner is not None else None
    entries = getattr(store, "_entries", None)
    if store is None or entries is None:
        return None
    lock = getattr(store, "_lock", None) or nullcontext()
    moved: list[tuple[str, Any, int]] = []

    def restore() -> None:
        with lock:
            for _, entry, tokens in moved:
                entry.session_id = parent
                entry.last_prompt_tokens = tokens
            store._save()

    with lock:
        for key, entry in list(entries.items()):
            if getattr(entry, "session_id", None) == parent:
                moved.append((key, entry, getattr(entry, "last_prompt_tokens", 0)))
        if not moved:
            return RoutingMove([], lambda: None)
        for _, entry, _ in moved:
            entry.session_id = child
            entry.last_prompt_tokens = 0
        saved = False
        try:
            store._save()
            saved = True
        finally:
            if not saved:  # the entries point at the parent again, as the file still says
                for _, entry, tokens in moved:
                    entry.session_id = parent
                    entry.last_prompt_tokens = tokens
    recorder = getattr(store, "_record_gateway_session_peer", None)
    if callable(recorder):
        for key, entry, _ in moved:
            with failing_open(f"the gateway peer record for {child}", "the chat is routed without it",
                              level=logging.DEBUG, advice=None):
                recorder(child, key, getattr(entry, "origin", None))
    return RoutingMove([key for key, _, _ in moved], restore)


async def gateway_send(runner: Any, source: Any, text: str) -> None:
    adapter = getattr(runner, "adapters", {}).get(getattr(source, "platform", None))
    if adapter is not None and getattr(source, "chat_id", None):
        await adapter.send(source.chat_id, text)


_gateway_message: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "session_guard_gateway_message", default=None
)


@contextmanager
def gateway_message_context(runner: Any, event: Any) -> Iterator[None]:
    """While the gateway handles ``event``, remember where it came from, so a plugin
    slash command (whose handler only receives its argument text) can tell which
    conversation it was typed in."""
    token = _gateway_message.set((weakref.ref(runner), getattr(event, "source", None)))
    try:
        yield
    finally:
        _gateway_message.reset(token)


def current_conversation_session() -> str | None:
    """The session a slash command was typed in: the gateway chat's routed session,
    else this process's ``HERMES_SESSION_ID`` (the CLI)."""
    current = _gateway_message.get()
    if current is not None:
        runner, source = current[0](), current[1]
        if runner is not None and source is not None:
            with failing_open("reading the chat's routed session", "the chat's routed session is unknown",
                              level=logging.DEBUG, advice=None) as failed:
                key = runner._session_key_for_source(source)
                entry = runner.session_store._entries.get(key)
            if failed:
                entry = None
            return getattr(entry, "session_id", None) if entry is not None else None
    return os.environ.get("HERMES_SESSION_ID") or None
