"""Test context engine (2): written from scratch against Hermes's ``ContextEngine``
interface. It folds the middle of the conversation into one message of its own
format (``DIGEST of N earlier messages`` ...), with none of Hermes's summary
markers, and never calls a model. Token accounting, the threshold, the preflight
estimate and the session callbacks are its own."""

from __future__ import annotations

import json
from typing import Any

from agent.context_engine import ContextEngine

ENGINE_NAME = "digest-engine"
KEEP_HEAD = 3  # non-system messages kept verbatim at the start
KEEP_TAIL = 4


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def rough_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(_text(m)) for m in messages if isinstance(m, dict)) // 4


def fold(messages: list[dict[str, Any]], head_n: int = KEEP_HEAD,
         tail_n: int = KEEP_TAIL) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(head, middle, tail)``: the tail grows by one where the folded message's role
    would repeat its neighbour's."""
    start = 1 if messages and messages[0].get("role") == "system" else 0
    head = messages[: start + head_n]
    tail_start = max(len(head), len(messages) - tail_n)
    folded_role = "user" if head and head[-1].get("role") == "assistant" else "assistant"
    while tail_start > len(head) and messages[tail_start].get("role") == folded_role:
        tail_start -= 1
    return head, messages[len(head):tail_start], messages[tail_start:]


class DigestEngine(ContextEngine):
    observer: Any = None  # see trimmed_compressor: set on the class by tests

    def __init__(self) -> None:
        self.session_id = ""
        self.sessions_started: list[tuple[str, dict[str, Any]]] = []
        self.threshold_percent = 0.5

    @property
    def name(self) -> str:
        return ENGINE_NAME

    def update_from_response(self, usage: dict[str, Any]) -> None:
        self.last_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.last_completion_tokens = int(usage.get("completion_tokens") or 0)
        self.last_total_tokens = int(usage.get("total_tokens") or 0)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return bool(self.threshold_tokens) and tokens >= self.threshold_tokens

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        return bool(self.threshold_tokens) and rough_tokens(messages) >= self.threshold_tokens

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return bool(fold(messages)[1])

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self.session_id = session_id
        self.sessions_started.append((session_id, {k: str(v) for k, v in kwargs.items()}))

    def digest(self, middle: list[dict[str, Any]]) -> str:
        lines = [f"DIGEST of {len(middle)} earlier messages (digest-engine)"]
        for m in middle:
            lines.append(f"- {m.get('role')}: {_text(m)[:60]}")
        return "\n".join(lines)

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list[dict[str, Any]]:
        observer = type(self).observer
        if observer is not None:
            observer(self)
        head, middle, tail = fold(messages)
        if not middle:
            return messages
        folded_role = "user" if head and head[-1].get("role") == "assistant" else "assistant"
        self.compression_count += 1
        return [*head, {"role": folded_role, "content": self.digest(middle)}, *tail]

    def get_status(self) -> dict[str, Any]:
        return {**super().get_status(), "engine": ENGINE_NAME, "session_id": self.session_id}

    def describe(self) -> str:
        return json.dumps({"engine": ENGINE_NAME, "session_id": self.session_id})


def register(ctx: Any) -> None:
    ctx.register_context_engine(DigestEngine())
