"""Test context engine (3): the hermes-lcm pattern. It keeps its own store, one
JSON file per session id under ``<HERMES_HOME>/ledger-engine/``: every message it
folds away is entered in the ledger of the session it is bound to, and the
``on_session_start`` calls it got are logged there. Bound to a new id (a rotation
announced as ``boundary_reason="compression"`` with another ``old_session_id``),
it starts an empty ledger: the folded messages of the conversation are then no
longer found under the id the conversation continues with."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent.context_engine import ContextEngine

ENGINE_NAME = "ledger-engine"
KEEP_HEAD = 2
KEEP_TAIL = 6


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def store_dir(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home or os.environ.get("HERMES_HOME") or ".") / "ledger-engine"


def read_ledger(session_id: str, home: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    path = store_dir(home) / f"{session_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"entries": [], "starts": []}


class LedgerEngine(ContextEngine):
    observer: Any = None  # see trimmed_compressor: set on the class by tests

    def __init__(self) -> None:
        self.session_id = ""
        self.home = ""
        self.threshold_percent = 0.5

    @property
    def name(self) -> str:
        return ENGINE_NAME

    # -- its own per-session store --------------------------------------------------
    def _load(self) -> dict[str, Any]:
        return read_ledger(self.session_id, self.home or None)

    def _save(self, ledger: dict[str, Any]) -> None:
        folder = store_dir(self.home or None)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.session_id}.json").write_text(json.dumps(ledger), encoding="utf-8")

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self.home = str(kwargs.get("hermes_home") or self.home or "")
        self.session_id = session_id  # bind: everything from now on is this id's ledger
        ledger = self._load()
        ledger["starts"].append({"session_id": session_id, "boundary_reason": kwargs.get("boundary_reason"),
                                 "old_session_id": kwargs.get("old_session_id")})
        self._save(ledger)

    def on_session_reset(self) -> None:
        super().on_session_reset()
        self.session_id = ""

    # -- the engine interface -------------------------------------------------------
    def update_from_response(self, usage: dict[str, Any]) -> None:
        self.last_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.last_completion_tokens = int(usage.get("completion_tokens") or 0)
        self.last_total_tokens = int(usage.get("total_tokens") or 0)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return bool(self.threshold_tokens) and tokens >= self.threshold_tokens

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        rough = sum(len(_text(m)) for m in messages if isinstance(m, dict)) // 4
        return bool(self.threshold_tokens) and rough >= self.threshold_tokens

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, **_: Any) -> list[dict[str, Any]]:
        observer = type(self).observer
        if observer is not None:
            observer(self)
        start = 1 if messages and messages[0].get("role") == "system" else 0
        head = messages[: start + KEEP_HEAD]
        tail_start = max(len(head), len(messages) - KEEP_TAIL)
        role = "user" if head and head[-1].get("role") == "assistant" else "assistant"
        while tail_start > len(head) and messages[tail_start].get("role") == role:
            tail_start -= 1
        middle = messages[len(head):tail_start]
        if not middle or not self.session_id:
            return messages
        ledger = self._load()
        first = len(ledger["entries"])
        ledger["entries"].extend({"role": m.get("role"), "text": _text(m)[:80]} for m in middle)
        self._save(ledger)
        self.compression_count += 1
        note = (f"<<ledger {self.session_id} entries {first}-{first + len(middle) - 1}>> "
                f"{len(middle)} messages are kept in the ledger of this conversation.")
        return [*head, {"role": role, "content": note}, *messages[tail_start:]]


def register(ctx: Any) -> None:
    ctx.register_context_engine(LedgerEngine())
