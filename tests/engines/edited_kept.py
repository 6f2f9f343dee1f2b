"""Engines that edit what they keep, built on ``digest-engine``'s fold (used in-process
by tests/integration/test_context_engines.py; not plugins of their own):

* :class:`CopyTrimmingEngine`: kept messages longer than :data:`TRIM_AT` characters are
  replaced by shortened copies (``{**m, "content": ...}``, as engines that prune large
  tool outputs do, Hermes's own compressor among them);
* :class:`InPlaceTrimmingEngine`: the same, shortening the kept messages in place;
* :class:`SummaryFirstEngine`: kept messages untouched, its summary moved in front of
  the kept head (right after the system prompt).
"""

from __future__ import annotations

from typing import Any

from .digest_engine import DigestEngine, fold

TRIM_AT = 2_000


def _trimmed(text: str) -> str:
    return text[:TRIM_AT] + f" [trimmed {len(text) - TRIM_AT} characters]"


class CopyTrimmingEngine(DigestEngine):
    def keep(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if isinstance(content, str) and len(content) > TRIM_AT:
            return {**message, "content": _trimmed(content)}
        return message

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list[dict[str, Any]]:
        head, middle, tail = fold(messages)
        if not middle:
            return messages
        folded_role = "user" if head and head[-1].get("role") == "assistant" else "assistant"
        self.compression_count += 1
        note = {"role": folded_role, "content": self.digest(middle)}
        return [*(self.keep(m) for m in head), note, *(self.keep(m) for m in tail)]


class InPlaceTrimmingEngine(CopyTrimmingEngine):
    def keep(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if isinstance(content, str) and len(content) > TRIM_AT:
            message["content"] = _trimmed(content)
        return message


class SummaryFirstEngine(DigestEngine):
    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list[dict[str, Any]]:
        head, middle, tail = fold(messages)
        if not middle:
            return messages
        self.compression_count += 1
        system = head[:1] if head and head[0].get("role") == "system" else []
        note = {"role": "assistant", "content": self.digest(middle)}  # turn-0 (user) follows it
        return [*system, note, *head[len(system):], *tail]
