"""Strategy ``detach_db`` (Hermes 0.13-0.17): Hermes compacts with its SessionDB detached, so its
rotation block (end the session, open a new id) cannot run; the guard then writes the compacted
transcript under the same id itself.

After Hermes's call the guard reads the live transcript again (turns other writers stored during
the summary stay live after the compacted block), keeps the snapshot, persists the compacted list
(re-basing the flush cursor: the row's ``flush_cursor``; on 0.17, whose transcript loads
``ORDER BY timestamp``, with timestamps that keep it first) and sends the boundary notifications
Hermes's detached path skipped. Nothing reached the live transcript until then, so every failure
on the way fails closed: the conversation continues uncompressed. On 0.16-0.17 the lock the guard
holds is Hermes's own ``compression_locks`` row, which the detached host never asks for.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from ... import host
from ..compaction_steps import Result
from .held_lock import HeldNativeLock


class DetachedCompaction(HeldNativeLock):
    """The guard writes the compaction Hermes computed with its SessionDB detached."""

    def native_lock_usable(self) -> bool:
        return True  # the detached host never asks for its own lock: the guard's hold is the only one

    def live_rows(self) -> tuple[list[dict[str, Any]] | None, list[tuple[int, int]] | None]:
        return host.live_brief(self.op.agent, self.op.sid), None

    def host_call(self) -> AbstractContextManager[Any]:
        return host.detached_session_db(self.op.agent)

    def lease_lapsed(self, reason: str, system_prompt: str) -> Result | None:
        # Fail closed: another process may own the session now; write nothing.
        return self.op.leave_unchanged("failed", reason, "warning", system_prompt=system_prompt)

    def before_persisting(self, foreign: list[Any]) -> list[Any]:
        return self.op.arrived_meanwhile(foreign)

    def persist(self, compressed: list[Any], foreign: list[Any], system_prompt: str) -> list[Any]:
        op = self.op
        final = compressed + foreign
        host.commit_memory(op.agent, op.before)
        host.persist_compacted(op.agent, op.sid, final, system_prompt, flush_cursor=op.behaviour.flush_cursor,
                               transcript_order=op.behaviour.transcript_order)
        op.persisted = final
        return final

    def persistence_failed(self, reason: str, exc: BaseException | None, system_prompt: str) -> Result | None:
        self.op.error_type = type(exc).__name__
        # Fail closed: nothing reached the live transcript, so keep the
        # uncompressed conversation rather than a compaction that was never stored.
        return self.op.leave_unchanged("failed", reason, "warning", system_prompt=system_prompt)

    def announce_boundary(self) -> None:
        host.notify_boundary(self.op.agent, self.op.sid)
