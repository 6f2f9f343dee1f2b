"""Keep the gateway's own transcript bookkeeping in step with an id-preserving compaction.

Up to 0.17 Hermes's gateway slices a turn's new messages at ``len(history)``, and
0.13-0.14 also keep a JSONL copy of every transcript next to state.db and, on the
next message, load whichever of the two is longer: both assume that a compaction
always moved the conversation to a new session (0.18.2+ re-baselines by itself
on ``agent._last_compaction_in_place``). When the guard keeps the id, the
gateway-turn seam calls :func:`rebase_after_compaction` so that

* the JSONL transcript of the live id holds the compacted transcript (the
  verbatim history is in the guard's snapshot), and
* ``history_offset`` points just past the compacted transcript, so the gateway
  appends exactly the turn's new messages (and does not write its fallback
  user/assistant pair into state.db a second time).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import atomic_write_text


@dataclass(frozen=True)
class Compaction:
    seq: int
    compacted: tuple[dict[str, Any], ...]


class CompactionLog:
    """The latest compaction per session id in this process (a sequence number and
    the compacted transcript as compression returned it), and the latest hand-off
    fork per parent session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._latest: dict[str, Compaction] = {}
        self._forks: dict[str, tuple[int, str]] = {}

    def record_fork(self, parent: str, child: str) -> None:
        with self._lock:
            self._seq += 1
            self._forks[parent] = (self._seq, child)

    def fork_target(self, session_id: str) -> str:
        """Where a conversation addressed to ``session_id`` lives now (following
        successive hand-offs); ``session_id`` itself when it was never handed off."""
        seen = {session_id}
        with self._lock:
            while session_id in self._forks:
                session_id = self._forks[session_id][1]
                if session_id in seen:
                    break
                seen.add(session_id)
        return session_id

    def fork_since(self, parent: str, mark: int) -> str | None:
        """The child ``parent`` was handed off to after ``mark``, if any."""
        with self._lock:
            found = self._forks.get(parent)
        return found[1] if found is not None and found[0] > mark else None

    def record(self, session_id: str, compacted: list[Any]) -> None:
        with self._lock:
            self._seq += 1
            self._latest[session_id] = Compaction(
                self._seq, tuple(dict(m) for m in compacted if isinstance(m, dict))
            )

    def mark(self) -> int:
        with self._lock:
            return self._seq

    def since(self, session_id: str, mark: int) -> Compaction | None:
        with self._lock:
            found = self._latest.get(session_id)
        return found if found is not None and found.seq > mark else None


def rewrite_jsonl(path: Path, messages: tuple[dict[str, Any], ...]) -> None:
    """Atomically replace a JSONL transcript (:func:`~hermes_session_guard.files.atomic_write_text`)."""
    # the replacement keeps the transcript's owner and mode (0600 for a new one)
    atomic_write_text(path, "".join(json.dumps(msg, ensure_ascii=False, default=str) + "\n" for msg in messages))


def rebase_after_compaction(
    session_store: Any, session_id: str, compaction: Compaction, result: Any, *, jsonl: bool = True
) -> None:
    keep = len(compaction.compacted)
    messages = result.get("messages") if isinstance(result, dict) else None
    if isinstance(messages, list):
        keep = min(keep, len(messages))
        if keep and keep == len(messages) and (messages[keep - 1] or {}).get("role") == "user":
            # The turn produced nothing after the compaction (empty reply, interruption):
            # the gateway then records the turn's user message itself when it finds no
            # new messages, a second time in state.db. Count it as this turn's message.
            keep -= 1
    path_fn = getattr(session_store, "get_transcript_path", None) if jsonl else None
    if callable(path_fn):
        path = Path(path_fn(session_id))
        if path.exists():
            rewrite_jsonl(path, compaction.compacted[:keep])
    if isinstance(messages, list):
        result["history_offset"] = keep
