"""Which sessions are compressing in this process right now.

The guard's compression runs in whatever thread the host chose (a gateway
executor thread, the agent's own thread); the gateway's event loop asks this
registry whether a message that just arrived belongs to a session under
compression. The durable counterpart is ``session_guard_compressions.phase``.
"""

from __future__ import annotations

import threading


class CompressingSessions:
    """Thread-safe map session id -> op ids of the compressions running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: dict[str, list[str]] = {}

    def begin(self, session_id: str, op_id: str) -> None:
        with self._lock:
            self._ops.setdefault(session_id, []).append(op_id)

    def end(self, session_id: str, op_id: str) -> None:
        with self._lock:
            ops = self._ops.get(session_id)
            if ops and op_id in ops:
                ops.remove(op_id)
                if not ops:
                    del self._ops[session_id]

    def op_for(self, session_id: str | None) -> str | None:
        """The op id of the oldest running compression of ``session_id``, or None."""
        if not session_id:
            return None
        with self._lock:
            ops = self._ops.get(session_id)
            return ops[0] if ops else None

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._ops)
