"""The latest compaction per session id in this process, and the latest hand-off fork per
parent session: what a gateway turn asks after it ran (where the conversation lives now; on
0.13-0.17 which compaction to re-base the gateway's transcript on,
:mod:`hermes_session_guard.seams.legacy.gateway_transcript`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


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
