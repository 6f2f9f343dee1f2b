"""Strategy ``host_native`` (Hermes 0.20+, ADR 0002): Hermes compacts in place under its own
holder-checked lock. The guard takes no lock (the row's ``lock`` is ``host``: a lease of the
guard's would be a second holder Hermes's commit refuses), keeps the generation check (asked again
once Hermes holds its lease) and adoption, and records the snapshot as a reference to the rows
Hermes keeps (the ids live when the engine returned) instead of a copy.

The compression's phase row rides Hermes's commit of its lease and the snapshot reference rides
Hermes's commit of the compaction (``archive_and_compact``), so the snapshot stands exactly when
the compaction does (ADR 0024, the ``host_commit`` and ``compaction_commit`` seams); a guard write
that cannot ride is made on its own (the row before the summary, the reference after Hermes's
commit). After Hermes compacted, the rows it kept live that the returned list lacks are added to
it, and the turns other writers stored that Hermes did not keep are carried over as in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import host
from ..contract.generations import Keyed, assess, keys_of
from ..fail_open import failing_open
from ..store.connection import Rider, board
from ..summaries.tags import has_summary_block
from .compaction_steps import Compaction, Result
from .in_place_compaction import InPlaceCompaction


class NativeCompaction(InPlaceCompaction):
    """Hermes compacts in place under its own lock; the guard's rows ride Hermes's commits."""

    def __init__(self, op: Compaction) -> None:
        super().__init__(op)
        # The phase row and the snapshot reference carried by Hermes's own commits (its lease,
        # its archive_and_compact) instead of commits of the guard's (store.connection.Rider).
        self.row_rider: Rider | None = None
        self.reference_rider: Rider | None = None
        # The ids of the rows live when the engine returned (the snapshot's reference).
        self.referenced: list[tuple[int, int]] = []

    def stale_check(self) -> Callable[[], bool] | None:
        return self.stale_under_host_lock

    def before_summary(self, unreachable: bool) -> None:
        if unreachable:
            # An engine the shim cannot reach never reports its return: the rows live before Hermes's
            # call are then the ones its commit replaces (Hermes keeps them after it, inactive).
            self.referenced = host.live_row_ranges(self.op.db_path, self.op.sid)

    def record_summary_start(self, engine: Any, unreachable: bool) -> None:
        op = self.op
        if engine is not None and not unreachable and host.session_db(op.agent) is not None \
                and op.runtime.seam_patched("host_commit"):
            # Hermes commits its lease before the summary and the shim asks the generation check
            # right after it (stale_under_host_lock): the row rides that commit, or is written then.
            steps = op.summary_steps()
            self.row_rider = board(op.store, "the compression's phase row", lambda: op.write_row(steps))
        else:
            super().record_summary_start(engine, unreachable)

    def engine_returned(self, snapshot_id: str, created_at: float, arrived: list[list[Any]]) -> None:
        op = self.op
        # Hermes took its lease and watermark before calling the engine: the rows live
        # now are the transcript its commit replaces (the snapshot references them).
        runs = self.referenced = host.live_row_ranges(op.db_path, op.sid)
        if runs and op.written_ahead is None and host.session_db(op.agent) is not None:
            # Hermes archives those rows right after this and keeps them: the reference rides
            # its archive_and_compact commit (not an earlier one), so the snapshot stands exactly
            # when the compaction does (reference_aboard); written after it if it could not ride.
            # Without the seams that carry it, it is written ahead of that commit, as on 0.19.
            # On failure, written once Hermes returned (write_reference).
            riding = op.runtime.seam_patched("compaction_commit") and op.runtime.seam_patched("host_commit")
            with failing_open("the snapshot reference written ahead", "written after Hermes's commit",
                              level=None) as failed:
                # the rows' digest is read now, never inside Hermes's transaction
                read = op.rows_read(runs)
                if riding:
                    self.reference_rider = board(
                        op.store, "the snapshot reference",
                        lambda: op.store_reference(snapshot_id, created_at, runs, read=read), compaction=True)
                else:
                    op.store_reference(snapshot_id, created_at, runs, read=read)
                    op.written_ahead = snapshot_id
            if failed:
                op.audit.info("snapshot.deferred", reason=failed.reason)

    def host_returned(self, snapshot_id: str) -> None:
        """What rode Hermes's commits is settled (row_aboard, reference_aboard)."""
        self.row_aboard()
        self.reference_aboard(snapshot_id)

    def row_aboard(self) -> None:
        """The phase row was given to Hermes's next commit. Committed with it:
        written. Otherwise (no commit of Hermes's on this thread yet, a failed one, or the
        guard's write in it failed) it rides no later one and is written now, on its own: before
        the summary starts, or once Hermes returned without reaching it (its lease not taken:
        a failure of that write says state.db refuses writes)."""
        rider, self.row_rider = self.row_rider, None
        if rider is None:
            return
        if rider.alight():
            self.op.begun = True
        else:
            self.op.begin(**self.op.summary_steps())

    def reference_aboard(self, snapshot_id: str) -> None:
        """Hermes's compression returned: the snapshot reference given to its
        archive_and_compact commit was committed with it (the snapshot stands exactly when the
        compaction does), or not; a guard write that failed inside it is written after
        Hermes's commit (keep_snapshot), said as deferred."""
        rider, self.reference_rider = self.reference_rider, None
        if rider is None:
            return
        if rider.alight():
            self.op.written_ahead = snapshot_id
        elif rider.state == "failed":
            self.op.audit.info("snapshot.deferred", reason="the guard's write inside Hermes's commit failed")

    def stale_under_host_lock(self) -> bool:
        """Asked by the engine shim once Hermes holds its lease: does the list
        predate a compaction committed since the generation check (which ran before
        Hermes's lease)? The same live row ids as that check read say no without reading the
        transcript again (any commit archives rows and writes new ones). A failed read says
        no: Hermes compacts as it would alone. Asked before the summary starts: the phase row is
        written by then (row_aboard)."""
        op = self.op
        self.row_aboard()
        with failing_open("the generation check", "Hermes compacts as it would alone", level=None) as failed:
            if op.live_ids and host.live_row_ranges(op.db_path, op.sid) == op.live_ids:
                return False
            live = Keyed(host.live_transcript(op.agent, op.sid))
            return assess(op.mine(), live, op.store.generation(op.sid), has_summary_block).stale
        op.audit.warning("generation.check_failed", reason=failed.reason, stage="under Hermes's compression lease")
        return False

    def refused(self, system_prompt: str) -> Result | None:
        op = self.op
        skipped_for = getattr(op.agent, "_compression_skipped_due_to_lock", None)
        if not skipped_for:
            return None
        if isinstance(skipped_for, str) and op.phase_error is None:
            return op.leave_unchanged("skipped", "another compression of this session holds Hermes's lock",
                                      system_prompt=system_prompt, holder=skipped_for)
        if isinstance(skipped_for, str):
            # state.db refuses the guard's writes too: a lease an earlier attempt could not release
            # under the same fault may be the holder. A problem, said once (the outcome).
            return op.leave_unchanged(
                "skipped", f"Hermes's lock is held and state.db refuses writes ({op.phase_error}); the "
                "conversation continues uncompressed", "warning", system_prompt=system_prompt, holder=skipped_for,
            )
        # Hermes found no holder: its own acquire failed (state.db locked, read-only or full)
        return op.leave_unchanged(
            "skipped", "Hermes could not take its compression lock: state.db refused the write (see its "
            "warning); the conversation continues uncompressed", "warning", system_prompt=system_prompt,
        )

    def commit_failed(self) -> bool:
        # 0.21+: Hermes's commit failed (state.db locked, read-only or full) and it handed
        # the list back unchanged, arming its split-failure cooldown.
        return bool(host.commit_failed_since(self.op.agent, self.op.cooldown_before))

    def keep_snapshot(self, planned_id: str, created_at: float) -> str | None:
        op = self.op
        if host.session_db(op.agent) is None:
            # Hermes keeps no rows to reference: a copy
            return super().keep_snapshot(planned_id, created_at)
        return op.written_ahead or self.write_reference(planned_id, created_at)

    def write_reference(self, snapshot_id: str, created_at: float) -> str | None:
        """The snapshot names the rows Hermes keeps (read when the engine
        returned), instead of a second copy; None when they were not seen."""
        if not self.referenced:
            self.op.audit.warning("snapshot.failed", reason="the rows Hermes compacted were not seen when its "
                                  "context engine returned (an engine the shim did not reach)")
            return None
        self.op.store_reference(snapshot_id, created_at, self.referenced)
        return snapshot_id

    def carry_over(self, compressed: list[Any], foreign: list[Any]) -> list[Any]:
        op = self.op
        # What Hermes kept live after the compacted block that the returned list lacks
        # (messages stored during the summary, re-sequenced after its watermark; on 0.22
        # rows its compressor did not hold): the agent continues with what is stored.
        # Turns other writers stored before this compression that the agent's list lacks
        # and that Hermes did not keep live (0.20 archives every live row up to its
        # watermark) are carried over like on 0.18-0.19. One read of the live transcript.
        kept, foreign = self.kept_and_lost(compressed, foreign)
        if kept:
            compressed.extend(kept)
            host.rebase_flush(op.agent, op.sid, compressed, op.behaviour.flush_cursor)
        return super().carry_over(compressed, foreign)

    def kept_and_lost(self, compressed: list[Any], foreign: list[Any]) -> tuple[list[Any], list[Any]]:
        """After Hermes compacted in place: the live messages ``compressed`` does not carry
        (in stored order), and the ``foreign`` messages that are not live. On a failed read
        nothing is added and nothing carried over."""
        op = self.op
        with failing_open("reading the live transcript", "nothing is added or carried over", level=None) as failed:
            if not foreign and self.holds_every_live_row(compressed):
                return [], []
            mine = set(Keyed(compressed).keys)
            brief = host.live_brief(op.agent, op.sid)
            if brief is not None:  # every live row is one of the list's and every foreign message is live
                stored = set(keys_of(brief))
                if stored <= mine and stored.issuperset(keys_of(foreign)):
                    return [], []
            live = Keyed(host.live_transcript(op.agent, op.sid))
        if failed:
            op.audit.warning("generation.check_failed", reason=failed.reason, stage="after Hermes compacted")
            return [], []
        stored = set(live.keys)
        theirs = Keyed(foreign)
        kept = [m for m, key in zip(live.messages, live.keys, strict=True) if key not in mine]
        lost = [m for m, key in zip(theirs.messages, theirs.keys, strict=True) if key not in stored]
        return kept, lost

    def holds_every_live_row(self, compressed: list[Any]) -> bool:
        """Every live row of the session is one of ``compressed``, by the row id Hermes stamped on
        each message it wrote (``_row_id``; 0.20+ stamps the compacted set): an id-only read
        instead of the transcript's texts. Any message without one, or any other live row, says no."""
        stamped = [m.get("_row_id") if isinstance(m, dict) else None for m in compressed]
        ids = [row_id for row_id in stamped if type(row_id) is int]
        if not ids or len(ids) < len(stamped):
            return False
        return host.runs_of(sorted(ids)) == host.live_row_ranges(self.op.db_path, self.op.sid)
