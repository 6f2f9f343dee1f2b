"""The steps both in-place designs share: ``host_in_place`` (Hermes 0.18-0.19,
:mod:`.legacy.in_place_compaction`: Hermes's own in-place compaction, forced on, keeps the id
and archives the old rows; the guard holds Hermes's native lock for the whole operation and
Hermes's own acquire of it re-enters, the ``native_lock_reentry`` seam) and ``host_native``
(:mod:`.native_compaction`).

When the context engine returns, before Hermes archives the live rows, the guard reads what other
writers stored during the summary (carried over after the compacted block) and writes the snapshot
ahead: a reference to the rows Hermes is about to archive when they hold exactly the list being
compacted, a copy otherwise (ADR 0003). Hermes writes the compacted transcript itself; when its
``archive_and_compact`` fails, the guard fails closed (state.db still has every turn). The
in-place designs share these steps; :mod:`.native_compaction` builds on them.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..seam_behaviour import SnapshotStorage
from .compaction_steps import CompactionSteps


class InPlaceCompaction(CompactionSteps):
    """Hermes writes the compaction in place; the guard holds the lock and writes the snapshot ahead."""

    host_keeps_id = True

    def live_rows(self) -> tuple[list[dict[str, Any]] | None, list[tuple[int, int]] | None]:
        return host.live_brief_and_runs(self.op.agent, self.op.sid)

    def host_call(self) -> AbstractContextManager[Any]:
        return host.forced_in_place(self.op.agent)

    def engine_returned(self, snapshot_id: str, created_at: float, arrived: list[list[Any]]) -> None:
        op = self.op
        # Hermes archives every live row of the session right after its engine
        # returns, including what other writers stored during the summary call:
        # those are carried over after the compacted block like the ones found before.
        # The same live row ids as before the generation check's read: nothing arrived,
        # and the transcript is not read a second time.
        live_now = host.live_row_ranges(op.db_path, op.sid) if host.session_db(op.agent) is not None else []
        if not live_now or live_now != op.live_ids:
            arrived[0] = op.arrived_meanwhile(arrived[0])
        if op.written_ahead is None:
            # Write-ahead: the host archives the old rows and writes the compacted ones
            # right after its engine returns, so the snapshot goes first. A process
            # killed between the two writes then leaves the history in the snapshot and
            # still live, never only in Hermes's archived rows.
            # On failure, retried once the host returned. Not a problem yet: if the retry fails
            # (snapshot.failed) or Hermes's own write fails too (compression.failed,
            # usually the same state.db fault), that event is the one loud line.
            with failing_open("the snapshot written ahead", "retried after Hermes's commit",
                              level=None) as failed:
                self.write_snapshot_ahead(snapshot_id, created_at, live_now)
                op.written_ahead = snapshot_id
            if failed:
                op.audit.info("snapshot.deferred", reason=failed.reason)

    def write_snapshot_ahead(self, snapshot_id: str, created_at: float, runs: list[tuple[int, int]]) -> None:
        """When the engine returned: Hermes is about to archive every live row
        (``active = 0, compacted = 1``) and keeps them verbatim under the same id, so the
        snapshot names those rows when they hold exactly the transcript being replaced
        (ADR 0003). A copy otherwise: turns the agent never flushed (Hermes's in-place path
        does not flush them before archiving), rows other writers stored meanwhile, or
        content Hermes stores differently from the agent's list, and always on a release whose
        own flows delete archived rows right after an in-place compaction (0.18: ``snapshot:
        copy``). ``runs``: the live row ids read when the engine returned."""
        op = self.op
        if op.behaviour.snapshot == SnapshotStorage.REFERENCE and host.session_db(op.agent) is not None:
            exact = op.live_is_before and runs == op.live_ids  # compared already: no digest of the list
            if runs and op.store_reference(snapshot_id, created_at, runs,
                                           matching=None if exact else op.before) is not None:
                return
        op.write_snapshot(snapshot_id, created_at)

    def host_wrote(self, compressed: list[Any]) -> bool:
        op = self.op
        if host.session_db(op.agent) is not None and not host.compacted_in_place(op.agent):
            # Hermes logs a failed archive_and_compact (locked, read-only or full state.db) and still
            # returns the compacted list; continuing with it would append the summary and tail after
            # the uncompressed rows at the next flush. Fail closed: state.db still has every turn.
            # A snapshot written ahead stays (the outcome names it): a verbatim copy of what is live.
            return False
        op.persisted = compressed
        return True

    def carry_over(self, compressed: list[Any], foreign: list[Any]) -> list[Any]:
        op = self.op
        if foreign:
            with failing_open("carrying over", "the messages stay where they were", level=None) as failed:
                host.append_messages(op.agent, op.sid, foreign)
                compressed.extend(foreign)
                host.rebase_flush(op.agent, op.sid, compressed, op.behaviour.flush_cursor)
            if failed:
                op.audit.warning("carry_over.failed", reason=failed.reason, messages=len(foreign))
        return foreign

    def persisted_after_guard_error(self, compressed: list[Any]) -> list[Any] | None:
        # failed before the guard looked: whether Hermes wrote in place decides
        with failing_open("asking whether Hermes compacted in place", "taken as not", level=logging.DEBUG,
                          advice=None):
            if host.session_db(self.op.agent) is not None and host.compacted_in_place(self.op.agent):
                return compressed
        return None

    def adopted(self) -> None:
        host.mark_compacted_in_place(self.op.agent)
