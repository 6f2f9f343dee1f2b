"""The session-stability contract for one compression, as a plain function.

``guarded_compression`` knows nothing about wrapt; the seam wrapper hands it the
agent, the message list and a ``call_host`` callable that runs Hermes's own
compression. This module is the one sequence every release runs (below); how the host
is kept from rotating the id is a *strategy* named by the seam table row for the
installed version, and each strategy is one module supplying the steps where Hermes's
designs differ (:mod:`.compaction_steps`, chosen through :data:`STEPS`):

``detach_db`` (:mod:`.legacy.detached_compaction`, 0.13-0.17)
    the host runs with its SessionDB detached; the guard persists the compacted
    transcript under the same id and sends the boundary notifications.
``host_in_place`` (:mod:`.legacy.in_place_compaction`, 0.18-0.19)
    the host's own in-place path is forced on, under the guard's hold of the host's
    native lock; the snapshot is written ahead when the context engine returns.
``host_native`` (:mod:`.native_compaction`, 0.20+, ADR 0002)
    the host compacts in place under its own holder-checked lock (the row's ``lock``
    is ``host``: the guard takes none); the snapshot references the rows Hermes keeps.

The sequence: pin the log context to the session; write the phase row; lock (or defer
to Hermes's own lock); generation check, or adopt; fix the snapshot id; call Hermes
(the strategy's scope), tagging the summaries its engine returns; keep or refuse the
result; snapshot (unless written ahead) and persist where Hermes does not; carry over
other writers' turns; record tags, generation and outcome in one commit; release.

In every case the pre-compression transcript is kept verbatim as a snapshot
``<id>.snapshot.<UTC ts>`` in the guard's own tables, as its messages or as a reference
to Hermes's rows holding them (it enters the one text index, ``store/text_index.py``, on the
first recall or search after it),
and the audit log gets one ``compression.*`` event per step, all naming the same session id.
The snapshot is written before the live transcript changes (write-ahead): detached, the
guard writes both itself, in that order; in place, it is written when the context
engine returns its compaction, before the host's ``archive_and_compact``. A process
killed between the two writes leaves the history live and in (or referenced by) the
snapshot. If the host then compacts nothing (it raised, made no progress, or its own
in-place write failed) a snapshot written ahead stays, verbatim, of a transcript still
live, and the outcome event names it (``snapshot_written_ahead``).

One compression per session at a time: the whole operation runs under the
session's lock (:mod:`~hermes_session_guard.locks.session_lock`; which lease table is
the row's ``lock`` behaviour). A contender that cannot get it within
``session_guard.lock.wait_seconds`` skips (``compression.skipped`` names the
holder). One that gets it after a compaction it did not see (its list predates
the session's latest generation, :mod:`~hermes_session_guard.contract.generations`) does
not compact again: it adopts the live transcript plus its own new messages
(``compression.adopted``). Turns other agents appended to the session meanwhile
stay live after the new compacted block.

Summaries: before the host persists the compacted list, every summary in it is
tagged ``is_compressed_summary`` (plus the host's own flag where it has one) and
each new summary gets the line ``[Original context: session <id>, turns <a>–<b>,
snapshot <snapshot_id>]`` after its first line. The snapshot id is fixed under
the lock, before the host runs. The tags are recorded in
``session_guard_summaries`` so a reload can put them back.

While the operation runs (from before the lock is requested until it is released)
the session is registered in ``runtime.compressing`` and has a
``session_guard_compressions`` row in phase ``started``; the row ends in the
outcome (``done``, ``adopted``, ``skipped``, ``failed``) on every exit path. The
gateway's busy-message seam reads both (and the lease) to buffer messages that
arrive meanwhile (:mod:`~hermes_session_guard.seams.buffering`). A failure to write the
row is logged and never fails the compression.

The after-compression hook (the bounded hand-off) runs once the lock is released
and outside the operation's pinned log context.

Clients, traces and metrics learn of each compaction through one hook,
``session_guard_compaction_event``: once when it starts, once when it ends
(docs/events.md). The row's phase times (lock taken, summary call started and ended)
are written as they happen, so ``status --session`` can tell where a compaction killed
midway stopped. The phase row, the events and the outcome's audit line are written by
:mod:`.compaction_report`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import host
from ..audit import new_op_id
from ..contract.generations import (
    Assessment,
    Keyed,
    assess,
    block_digest,
    foreign_messages,
    genuinely_new,
    keys_of,
    own_turn_apart,
    turn_in_progress,
    turn_last,
)
from ..fail_open import failing_open
from ..hooks.manager import get_plugin_manager
from ..host import engines as engine_support
from ..locks.liveness import holder_dead
from ..locks.session_lock import (
    LockBusy,
    LockGrant,
    LockUnavailable,
)
from ..runtime import Runtime
from ..seam_behaviour import Behaviour, FailurePolicy, LockMode, SnapshotStorage, Strategy
from ..store import (
    CompactionRows,
    SnapshotGone,
    SnapshotInfo,
    content_digest,
    message_text,
    text_hash,
)
from ..summaries.tags import (
    compacted_range,
    decorate_summaries,
    has_summary_block,
    remember_summary,
    summary_indices,
    tag,
)
from .compaction_report import CompactionReport, CompressionOutcome
from .compaction_steps import STEPS, register
from .native_compaction import NativeCompaction

# Each Hermes design's steps (the seam row's ``strategy`` chooses them; compaction_steps):
# the strategies of releases before native compaction register from seams/legacy/.
register(Strategy.HOST_NATIVE, NativeCompaction)


@dataclass(frozen=True)
class LockPolicy:
    """How a seam row locks: which lease table (``lock`` behaviour) and what happens
    when the lock itself cannot be taken because the table fails (``lock_failure``):
    ``closed`` skips this compression (nothing changes; Hermes retries later),
    ``open`` compresses without the lock."""

    mode: LockMode = LockMode.GUARD
    on_failure: FailurePolicy = FailurePolicy.CLOSED


def _no_progress(before: list[Any], after: list[Any], original: list[Any]) -> bool:
    return after is original or len(after) >= len(before) and after == before


def _unchanged(messages: list[Any], before: list[Any]) -> list[Any]:
    """The caller's own list, restored if the host mutated it (identity is kept:
    later hosts track flushed messages by ``id()``)."""
    if messages != before:
        messages[:] = before
    return messages


# Hermes's own write of the compacted transcript failed (its commit, or its archive_and_compact)
_NOT_WRITTEN = ("Hermes could not write the compacted transcript to state.db (see its warning); "
                "the conversation continues uncompressed")

_active = threading.local()


def compressing_session() -> str | None:
    """The session whose compression this thread is running (the host rebuilds the
    system prompt inside it, before the snapshot exists)."""
    return getattr(_active, "session_id", None)


@contextmanager
def compressing_scope(session_id: str) -> Iterator[None]:
    """Mark this thread as running ``session_id``'s compression (see :func:`compressing_session`)."""
    previous = compressing_session()
    _active.session_id = session_id
    try:
        yield
    finally:
        _active.session_id = previous


def snapshot_id_for(session_id: str, created_at: float, exists: Callable[[str], bool]) -> str:
    """The derived snapshot id; a numeric suffix keeps it unique when two
    compressions of one session share a timestamp (frozen clocks, fast hosts)."""
    base: str = get_plugin_manager().hook.session_guard_snapshot_id(session_id=session_id, created_at=created_at)
    candidate, n = base, 1
    while exists(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def guarded_compression(
    runtime: Runtime,
    strategy: str,
    agent: Any,
    messages: list[Any],
    call_host: Callable[[], tuple[list[Any], str]],
    *,
    native_summary_key: str | None = None,
    system_message: str | None = None,
    lock: LockPolicy | None = None,
    behaviour: Behaviour | Mapping[str, str] | None = None,
) -> tuple[list[Any], str]:
    """Run one host compression under the contract; returns the host's result shape.
    ``native_summary_key`` is the host's own summary flag, on hosts that have one;
    ``behaviour`` is the seam row's other version data (``flush_cursor``,
    ``transcript_order``)."""
    sid = host.session_id(agent)
    if not sid or not isinstance(messages, list):
        return call_host()
    op = _Operation(runtime, strategy, agent, sid, messages, call_host, system_message, native_summary_key,
                    Behaviour.of(behaviour))
    return op.run(lock or LockPolicy())


class _Operation(CompactionReport):
    """One guarded compression of one session: every audit line names ``sid``."""

    # Slots: an operation has more attributes than CPython keeps in a shared-key instance
    # dict (30); with a dict, building one took 0.76 ms median in bench_compression's setting,
    # with slots 0.25 ms (Python 3.11, docs/performance.md).
    __slots__ = (
        "runtime", "strategy", "agent", "sid", "messages", "call_host", "system_message",
        "native_summary_key", "behaviour", "op_id", "audit", "pm",
        "before", "started", "cooldown_before", "db_path", "store", "grant", "lock_fields", "done",
        "persisted", "written_ahead", "produced",
        "engine_returned_at", "lock_acquired_at", "summary_started_at", "summary_ended_at", "error_type",
        "live_ids", "live_digest", "live_is_before", "_mine", "started_wall",
        "steps",
    )  # and CompactionReport's

    def __init__(
        self,
        runtime: Runtime,
        strategy: str,
        agent: Any,
        sid: str,
        messages: list[Any],
        call_host: Callable[[], tuple[list[Any], str]],
        system_message: str | None,
        native_summary_key: str | None,
        behaviour: Behaviour,
    ) -> None:
        self.runtime, self.strategy, self.agent, self.sid = runtime, strategy, agent, sid
        self.messages, self.call_host, self.system_message = messages, call_host, system_message
        self.native_summary_key = native_summary_key
        self.behaviour = behaviour  # the row's flush_cursor, transcript_order and snapshot storage
        self.op_id = new_op_id()
        self.audit = runtime.audit.operation(sid, self.op_id)
        self.pm = get_plugin_manager()
        self.before = [dict(m) if isinstance(m, dict) else m for m in messages]
        self.started = time.perf_counter()
        self.started_wall = time.time()
        self.cooldown_before = host.failure_cooldown_mark(agent)
        self.db_path = host.db_path(agent)
        self.store = runtime.store_for(self.db_path)
        runtime.remember_session(sid, self.db_path)
        self.grant: LockGrant | None = None
        self.lock_fields: dict[str, Any] = {}
        # Set once the compaction stands: (snapshot id, the list the conversation continues with).
        self.done: tuple[str | None, list[Any]] | None = None
        self.persisted: list[Any] | None = None  # the list state.db holds live once the compaction is written
        # In place: the snapshot id once stored ahead of the host's own live write (never written twice).
        self.written_ahead: str | None = None
        self.phase_error: str | None = None  # the first failure to write this operation's phase row
        self.phase_warned = False
        self.last: CompressionOutcome | None = None  # the outcome audited last (the phase row's end)
        # The phase row: written (see begin) and the outcome it holds (see settle).
        self.begun = False
        self.outcome_written: CompressionOutcome | None = None
        # Content hashes of the summaries an engine of its own produced (known by position).
        self.produced: set[str] = set()
        self.engine_returned_at: float | None = None  # wall clock: Hermes's context engine returned
        self.lock_acquired_at: float | None = None  # wall clock: the guard's lock taken (recorded with the next)
        self.summary_started_at: float | None = None  # wall clock: Hermes's compression called
        self.summary_ended_at: float | None = None
        self.error_type: str | None = None  # the exception class that failed it, if one did
        self.end_emitted = False
        # In place: the live row ids read just before the generation check's read of the
        # live transcript (None when that check did not run or failed).
        self.live_ids: list[tuple[int, int]] | None = None
        # The row count and content digest of the rows ``live_ids`` names, as the generation
        # check read them (a reference to those same rows need not read them again).
        self.live_digest: tuple[int, str] | None = None
        self.live_is_before = False  # ... and those rows hold exactly ``before`` (roles and texts)
        self._mine: Keyed | None = None
        self.steps = STEPS[strategy](self)  # what the row's Hermes design does at each step

    def leave_unchanged(self, status: str, reason: str, level: str = "info", *,
                        system_prompt: str | None = None, **extra: Any) -> tuple[list[Any], str]:
        self.finish(self.outcome(status, reason), level, **extra)
        if status == "failed":
            self.pm.hook.session_guard_compression_failed(session_id=self.sid, op_id=self.op_id, reason=reason)
        if system_prompt is None:
            system_prompt = host.current_system_prompt(self.agent, self.system_message)
        return _unchanged(self.messages, self.before), system_prompt

    # -- the operation --------------------------------------------------------------
    def run(self, lock: LockPolicy) -> tuple[list[Any], str]:
        with host.pinned_log_context(self.sid):
            result = self.run_locked(lock)
        if self.done is not None:
            snapshot_id, continued = self.done
            # After the lock is released and outside the pinned log context: an
            # extension may move the conversation on (an explicit, logged hand-off
            # fork), and the tag must then follow it.
            with failing_open("an after-compression extension", f"the compression of {self.sid} stands",
                              advice=None):
                self.pm.hook.session_guard_after_compression(
                    session_id=self.sid, op_id=self.op_id, snapshot_id=snapshot_id, compressed=continued,
                    agent=self.agent,
                )
        return result

    def run_locked(self, lock: LockPolicy) -> tuple[list[Any], str]:
        self.audit.info("compression.started", messages=len(self.before), strategy=self.strategy,
                        host_version=self.runtime.host_version)
        self.emit(None)
        self.runtime.compressing.begin(self.sid, self.op_id)
        self.record_phase(self.close_interrupted)
        try:
            return self.lock_and_compress(lock)
        finally:
            if not self.end_emitted:  # an error the steps below did not turn into an outcome
                self.emit(self.outcome("failed", "the compaction ended without recording an outcome"))
            self.runtime.compressing.end(self.sid, self.op_id)
            if self.last is None or self.last is not self.outcome_written:  # not written with the compaction
                self.record_phase(self.write_outcome, self.last)
            if self.phase_error is not None:
                self.warn_phase()

    def close_interrupted(self) -> None:
        """Earlier compressions of this session still ``started`` whose process is provably
        gone (killed midway) are recorded as ``interrupted``: they will never finish."""
        for op_id, holder in self.store.unfinished_compressions(self.sid):
            if op_id != self.op_id and holder_dead(holder):
                self.store.mark_interrupted(op_id, "the process running it ended before it recorded an outcome")
                self.audit.warning("compression.interrupted_found", interrupted_op_id=op_id)

    def clear_dead_host_holder(self) -> str | None:
        """Native mode: Hermes's own lease on the session held by a process that is provably
        gone (locks.liveness; a pid-only holder of a Hermes without the guard whose pid is
        gone on this machine) is released, holder-qualified, so Hermes's acquire takes it
        now instead of waiting out the lease. Returns the holder released."""
        # Hermes's own lock path decides, as without the guard
        with failing_open(f"clearing the dead holder of {self.sid}'s compression lock", "Hermes waits for its lease",
                          level=logging.WARNING, advice=None) as failed:
            leases = host.native_leases(self.agent)
            holder = leases.holder(self.sid) if leases is not None else None
            if leases is None or holder is None or not holder_dead(holder):
                return None
            leases.release(self.sid, holder)
        if failed:
            return None
        self.audit.warning("lock.taken_over", dead_holder=holder, lock="host")
        return holder

    def lock_and_compress(self, lock: LockPolicy) -> tuple[list[Any], str]:
        if lock.mode == LockMode.HOST:
            # Native mode (0.20+): Hermes takes its own lease and checks it inside its commit;
            # a lease of the guard's would be a second holder that commit refuses.
            self.lock_fields = {"lock": "host"}
            dead = self.clear_dead_host_holder()
            if dead is not None:
                self.lock_fields["took_over_from"] = dead
            return self.compress_locked()
        cfg = self.runtime.config.lock
        self.begin()  # the wait for the lease may be long: the row says the operation is waiting
        try:
            lease = self.steps.lease_table(lock.mode)
            taken = self.runtime.locks_for(self.db_path).acquire(
                self.sid, self.op_id, wait_seconds=cfg.wait_seconds, lease_seconds=cfg.lease_seconds,
                lease=lease,
            )
        except LockUnavailable as exc:
            if lock.on_failure == FailurePolicy.CLOSED:
                # One loud line: the outcome event itself, at ERROR.
                return self.leave_unchanged(
                    "skipped", f"compression lock unavailable: {exc}", "error",
                    hint="skipped so it cannot fork the session; Hermes retries at its next threshold check. "
                         "Check that state.db is writable (disk space, permissions, a process holding it) and "
                         "run `hermes-session-guard selftest` if it persists.",
                )
            self.audit.warning("lock.unavailable", reason=str(exc))
            taken = None
        if isinstance(taken, LockBusy):
            return self.leave_unchanged(
                "skipped", "another operation holds this session's compression lock",
                holder=taken.holder, lock=taken.scope, waited_ms=round(taken.waited * 1000, 2),
            )
        self.grant = taken
        if taken is None:
            self.lock_fields = {"lock": "none"}
        else:
            self.lock_acquired_at = time.time()  # written with the summary's start, moments later (one write)
            self.lock_fields = {"lock": taken.scope, "lock_holder": taken.holder,
                                "waited_ms": round(taken.waited * 1000, 2), "waited_for": taken.waited_for}
            if taken.took_over:
                self.lock_fields["took_over_from"] = taken.took_over
                self.audit.warning("lock.taken_over", dead_holder=taken.took_over, lock=taken.scope)
        try:
            with self.steps.host_may_reenter(taken):
                return self.compress_locked()
        finally:
            if taken is not None:
                taken.release()

    def compress_locked(self) -> tuple[list[Any], str]:
        sid, agent, steps, store = self.sid, self.agent, self.steps, self.store
        self.pm.hook.session_guard_before_compression(session_id=sid, op_id=self.op_id, messages=self.messages)

        foreign, adopted = self.check_generation()
        if adopted is not None:
            return adopted

        # The snapshot id is fixed before the host runs: the summary's recall line names
        # it, and in place the host persists the summary itself. Under the lock, so
        # no other compression of this session can take the same id meanwhile.
        created_at = time.time()
        snapshot_id = snapshot_id_for(sid, created_at, store.snapshot_exists)
        summaries_cfg = self.runtime.config.summaries
        native_key = self.native_summary_key
        span: list[tuple[int, int] | None] = [None]
        arrived: list[list[Any]] = [foreign]

        def decorate(engine_input: list[Any], engine_output: list[Any], found: list[int] | None) -> None:
            if self.engine_returned_at is None:
                self.engine_returned_at = time.time()
            if engine_output and engine_output != engine_input:  # compacted: before Hermes writes it
                steps.engine_returned(snapshot_id, created_at, arrived)
            span[0] = compacted_range(engine_input, engine_output)
            # An engine of its own (not Hermes's compressor family) writes summaries in its
            # own format: the guard knows them by position, as what the engine produced.
            made = [] if engine_support.builtin_family(host.context_engine(agent)) \
                else engine_support.produced_positions(engine_input, engine_output)
            decorate_summaries(
                engine_input, engine_output, session_id=sid, snapshot_id=snapshot_id,
                header=summaries_cfg.recall_header, native_key=native_key, produced=made, found=found,
            )
            self.produced = {text_hash(message_text(engine_output[i])) for i in made}

        engine = host.context_engine(agent)
        unreachable = engine is not None and engine_support.compress_shape(engine) is not None
        steps.before_summary(unreachable)
        self.summary_started_at = time.time()
        steps.record_summary_start(engine, unreachable)
        try:
            with compressing_scope(sid), host.watching_engine(agent, decorate, steps.stale_check()) as verdict, \
                    steps.host_call():
                compressed, system_prompt = self.call_host()
        except BaseException as exc:
            self.host_returned(snapshot_id)
            self.error_type = type(exc).__name__
            reason = f"{type(exc).__name__}: {exc}"
            self.finish(self.outcome("failed", reason), "warning")
            self.pm.hook.session_guard_compression_failed(session_id=sid, op_id=self.op_id, reason=reason)
            raise
        self.host_returned(snapshot_id)

        if verdict.found_stale:
            # Native mode: the generation check above ran before Hermes took its lease; another
            # compaction committed in between. Adopt it now instead of summarising again.
            _, adopted = self.check_generation()
            if adopted is not None:
                return adopted
        with failing_open("settling the compaction", "the compaction stands", level=None) as failed:
            return self.settle(compressed, system_prompt, verdict.failure, snapshot_id, created_at, span[0],
                               arrived[0])
        assert failed.exc is not None
        return self.guard_failed_after_host(failed.exc, compressed, system_prompt)

    def host_returned(self, snapshot_id: str) -> None:
        """Hermes's compression call returned or raised: what the strategy left riding on its
        commits is settled, and the summary call's end is noted. When the summary
        call ended: its context engine returned (seen by the shim), else Hermes's compression
        call returned. Written with the outcome (``run_locked``)."""
        self.steps.host_returned(snapshot_id)
        self.summary_ended_at = time.time()

    def settle(self, compressed: list[Any], system_prompt: str, failure: str | None, planned_id: str,
               created_at: float, span: tuple[int, int] | None, foreign: list[Any]) -> tuple[list[Any], str]:
        """Everything after the host's compression returned: keep or refuse its result,
        snapshot (unless it was written ahead), persist (detached), record. ``planned_id``: the
        snapshot id the summary's recall line names; None below when no snapshot was kept."""
        snapshot_id: str | None = planned_id
        sid, agent, steps, before, store = self.sid, self.agent, self.steps, self.before, self.store
        native_key = self.native_summary_key
        if failure:
            return self.leave_unchanged("failed", failure, "warning", system_prompt=system_prompt)
        refused = steps.refused(system_prompt)
        if refused is not None:
            return refused
        if _no_progress(before, compressed, self.messages):
            if steps.commit_failed():  # a problem, said once
                return self.leave_unchanged("failed", _NOT_WRITTEN, "warning", system_prompt=system_prompt)
            cooling = host.failure_cooldown_class(agent) if self.cooldown_before > time.monotonic() else None
            if cooling:  # already said when the failure that armed it happened
                return self.leave_unchanged("skipped", f"Hermes's compression-failure cooldown is running "
                                            f"(armed by {cooling})", system_prompt=system_prompt)
            # Nothing was persisted (detached) or the host left the rows alone.
            return self.leave_unchanged("skipped", "host made no progress (cooldown or nothing to compress)",
                                        system_prompt=system_prompt)
        if not steps.host_wrote(compressed):
            return self.leave_unchanged("failed", _NOT_WRITTEN, "warning", system_prompt=system_prompt)

        if self.grant is not None and not self.grant.still_held():
            reason = "the compression lease lapsed while the summary ran (process stalled longer than lease_seconds)"
            refused = steps.lease_lapsed(reason, system_prompt)
            if refused is not None:
                return refused

        # The host may have copied the dicts after the engine returned them.
        # The summaries are what the compressor wrote (or what was tagged already), not
        # a kept message that merely quotes the prefix.
        marks = []
        produced = [i for i, m in enumerate(compressed)
                    if self.produced and isinstance(m, dict) and text_hash(message_text(m)) in self.produced]
        for i in sorted({*summary_indices(compressed, self.before), *produced}):
            tag(compressed[i], native_key)
            remember_summary(message_text(compressed[i]))
            marks.append((i, text_hash(message_text(compressed[i]))))
        block = list(compressed)  # what this compaction wrote; carried-over turns follow it
        final = compressed
        foreign = steps.before_persisting(foreign)
        with failing_open("the guard's persistence", "reported below", level=None) as failed:
            snapshot_id = steps.keep_snapshot(planned_id, created_at)
            final = steps.persist(compressed, foreign, system_prompt)
        if failed:
            refused = steps.persistence_failed(f"guard persistence failed: {failed.reason}", failed.exc,
                                               system_prompt)
            if refused is not None:
                return refused
            snapshot_id = None  # the host already compacted in place and archived the old rows itself
        foreign = steps.carry_over(compressed, foreign)
        # Turns that other agents of the session persisted meanwhile stay after the
        # compacted block in state.db (in arrival order), but in the list this agent
        # continues with they go before its own turn in progress, which it is answering.
        ongoing = turn_in_progress(block, has_summary_block) if len(final) > len(block) else 0
        if ongoing:
            final = [*block[:-ongoing], *final[len(block):], *block[-ongoing:]]
            # another turn's prompt still waiting for its answer is not put next to this one
            final = own_turn_apart(final, keys_of(final), keys_of(block[-ongoing:]), has_summary_block,
                                   start=len(block) - ongoing)
            host.rebase_flush(agent, sid, final, self.behaviour.flush_cursor)
            block = block[:-ongoing]  # the generation's block: what both lists start with
        steps.announce_boundary()
        if snapshot_id is not None:
            self.runtime.note_snapshot(sid, self.db_path)
        # One commit: the summary tags, the generation and the outcome's phase row. On failure the
        # tags stay on the live list (only a reload loses them) and the next contender falls back
        # to comparing summary positions.
        summary_chars = sum(len(message_text(compressed[i]) or "") for i, _ in marks if i < len(compressed))
        outcome = self.outcome("done", after=len(final), snapshot_id=snapshot_id, summary_chars=summary_chars)
        generation: int | None = None
        with failing_open("recording the summaries and the generation", "said in the audit", level=None) as failed:
            first, last = span or (None, None)
            rows = CompactionRows(sid, snapshot_id, created_at, tuple((i, h, first, last) for i, h in marks),
                                  len(block), block_digest(keys_of(block)), self.outcome_row(outcome))
            generation = store.record_compaction(rows).generation
            self.begun, self.outcome_written = True, outcome
        if failed:  # none of them written: the phase row is written on its own once the operation ends
            generation = None
            self.audit.warning("summaries.record_failed", reason=failed.reason)
            self.audit.warning("generation.failed", reason=failed.reason)
        self.runtime.compactions.record(sid, final)
        self.finish(outcome, generation=generation,
                    carried_over=len(foreign) or None, summary_positions=[i for i, _ in marks])
        self.done = (snapshot_id, final)
        return final, system_prompt

    def arrived_meanwhile(self, foreign: list[Any]) -> list[Any]:
        """Other writers of the session may store messages while the summary runs
        (another agent finishing a turn, another process storing a platform message).
        The live transcript is read again right before the compacted one replaces it
        (detached hosts, 0.13-0.17: before the guard persists; in place, 0.18+: when
        the engine returns, before Hermes archives), so whatever arrived during the
        summary call stays live after the compacted block, in order. On a failed read
        the messages found before the summary call are kept as they were."""
        if host.session_db(self.agent) is None:
            return foreign
        with failing_open("reading the live transcript", "the messages found before are kept",
                          level=None) as failed:
            return foreign_messages(self.mine(), Keyed(host.live_transcript(self.agent, self.sid)))
        self.audit.warning("generation.check_failed", reason=failed.reason, stage="before persisting the compaction")
        return foreign

    def mine(self) -> Keyed:
        """The pre-compression list with its keys, computed once per operation."""
        if self._mine is None:
            self._mine = Keyed(self.before)
        return self._mine

    def rows_read(self, runs: list[tuple[int, int]]) -> tuple[int, str]:
        """The count and digest of Hermes's rows ``runs``: as the generation check read them
        when they are the same rows (known_read), else read now (store.rows_digest)."""
        return self.known_read(runs) or self.store.rows_digest(self.sid, runs)

    def known_read(self, runs: list[tuple[int, int]]) -> tuple[int, str] | None:
        """The count and digest the generation check read, when ``runs`` are the rows it read."""
        return self.live_digest if runs == self.live_ids else None

    def store_reference(self, snapshot_id: str, created_at: float, runs: list[tuple[int, int]],
                        matching: list[Any] | None = None,
                        read: tuple[int, str] | None = None) -> SnapshotInfo | None:
        """Record the snapshot as Hermes's rows ``runs`` of this session (store.write_snapshot_reference);
        ``read``: their count and digest, read already."""
        if read is None:
            read = self.known_read(runs)
        return self.store.write_snapshot_reference(
            snapshot_id=snapshot_id, session_id=self.sid, row_runs=runs, op_id=self.op_id,
            host_version=self.runtime.host_version, host_mode=self.strategy, created_at=created_at,
            matching=matching, read=read,
        )

    def write_snapshot(self, snapshot_id: str, created_at: float) -> None:
        """Store the pre-compression transcript verbatim (indexed for recall by the first recall that needs it)."""
        self.store.write_snapshot(
            snapshot_id=snapshot_id,
            session_id=self.sid,
            messages=self.before,
            op_id=self.op_id,
            host_version=self.runtime.host_version,
            host_mode=self.strategy,
            created_at=created_at,
        )

    def guard_failed_after_host(self, exc: Exception, compressed: list[Any],
                                system_prompt: str) -> tuple[list[Any], str]:
        """A guard error once the host's compression has run: it is never run again, and
        the caller continues with what state.db holds (the compaction, once persisted;
        its own list otherwise), so the next flush neither duplicates nor drops turns."""
        reason = f"guard error after Hermes compressed: {type(exc).__name__}: {exc}"
        self.error_type = type(exc).__name__
        hint = "Run `hermes-session-guard selftest`."
        persisted = self.persisted
        if persisted is None:
            persisted = self.steps.persisted_after_guard_error(compressed)
        # the audit itself is what failed: still say so once
        with failing_open(f"auditing a {reason}", "the caller continues with what state.db holds"):
            if persisted is None:
                return self.leave_unchanged("failed", reason, "error", system_prompt=system_prompt, hint=hint)
            self.finish(self.outcome("done", reason + "; the compaction stands", after=len(persisted)), "error",
                        hint=hint)
        if persisted is None:  # leave_unchanged failed
            return _unchanged(self.messages, self.before), system_prompt
        return persisted, system_prompt

    def check_generation(self) -> tuple[list[Any], tuple[list[Any], str] | None]:
        """Where this list stands against the live transcript: the turns other agents
        appended meanwhile (carried over after the compacted block), or, when the list
        predates the latest compaction, the adopted result instead of a compaction.
        The live read is a second copy of every text of the transcript; it ends with
        this call, before the long summary call during which many sessions may be
        compressing at once (13 sessions of 48 messages: ~6 MB less at the peak)."""
        self.live_digest, self.live_is_before = None, False
        if host.session_db(self.agent) is None:
            return [], None
        # on failure, compress as before, under the lock, without the generation check
        with failing_open("the generation check", "compressed without it", level=None) as failed:
            # the live rows as stored and, in place, their ids (as host.live_row_ranges gives them): one read
            brief, ids = self.steps.live_rows()
            mine = self.mine()
            if self.holds_live(mine, brief, ids):  # the live rows are this list's own, in order: nothing foreign
                self.live_ids = ids
                return [], None
            live = Keyed(host.live_transcript(self.agent, self.sid))
            standing = assess(mine, live, self.store.generation(self.sid), has_summary_block)
            foreign = [] if standing.stale else foreign_messages(mine, live)
            self.live_ids = ids
        if failed:
            self.audit.warning("generation.check_failed", reason=failed.reason)
            return [], None
        if standing.stale:
            return [], self.adopt(Keyed(self.messages, mine.keys), live, standing)
        return foreign, None

    def holds_live(self, mine: Keyed, brief: list[dict[str, Any]] | None,
                   ids: list[tuple[int, int]] | None) -> bool:
        """The session's live rows as stored (``brief``: host.live_brief) are the first messages
        of ``mine`` (by key): then no other writer stored a turn this list lacks and the list
        does not predate a compaction, and Hermes's loader need not read the transcript. Any
        difference, or a failed read (None), says no: the caller reads the transcript.
        ``ids``: every live row's id, as runs (in place only)."""
        if brief is None or len(brief) > len(mine.keys) or keys_of(brief) != mine.keys[:len(brief)]:
            return False
        if ids and self.behaviour.snapshot == SnapshotStorage.REFERENCE \
                and host.runs_of([m["_row_id"] for m in brief]) == ids:
            # the brief read is every row ``ids`` names: their digest, for the reference this
            # compaction writes to them, and whether they hold exactly the list being replaced
            # (roles and texts as stored); a release that copies (0.18.x) needs neither
            self.live_digest = (len(brief), content_digest(brief))
            self.live_is_before = len(brief) == len(self.before) and all(
                isinstance(m, dict) and m.get("role") == row["role"] and m.get("content") == row["content"]
                for m, row in zip(self.before, brief, strict=True))
        return True

    def adopt(self, mine: Keyed, live: Keyed, standing: Assessment) -> tuple[list[Any], str]:
        """The list predates the latest compaction: take the live transcript plus the
        messages only this list has, instead of summarising the same turns again."""
        sid, store = self.sid, self.store
        with failing_open("reading earlier transcripts", "left unchanged", level=None) as failed:
            versions = []
            for snap in reversed(store.list_snapshots(sid)):
                try:
                    versions.append(store.snapshot_messages(snap.snapshot_id))
                except SnapshotGone:  # Hermes no longer holds its rows: no earlier transcript to line up with
                    continue
            new = genuinely_new(mine, [*versions, live], live, standing.block_len)
        if failed:
            return self.leave_unchanged("failed", f"reading earlier transcripts failed: {failed.reason}",
                                        "warning", generation=standing.generation)
        if new is None:
            return self.leave_unchanged(
                "skipped",
                "the message list predates the latest compaction and lines up with no earlier transcript; "
                "left as it is rather than compacted again",
                "warning", generation=standing.generation, basis=standing.basis,
            )
        adopted = [*live.messages, *new]
        new_keys = keys_of(new)
        ongoing = turn_in_progress(mine.messages, has_summary_block)
        own = [*new_keys, *mine.keys[len(mine.keys) - ongoing:]]
        if ongoing:  # its own turn in progress ends the list, after what others persisted meanwhile
            adopted = turn_last(adopted, [*live.keys, *new_keys], mine.keys[-ongoing:])
        # Each of its own messages stays a message of its own: another turn's prompt still
        # waiting for its answer is not put next to it (Hermes would fold the two into one).
        # (The compacted block itself may end with the compressing turn's prompt, not answered yet.)
        block = standing.block_len - turn_in_progress(live.messages[:standing.block_len], has_summary_block)
        adopted = own_turn_apart(adopted, keys_of(adopted), own, has_summary_block, start=block)
        with failing_open("adopting the live transcript", "left unchanged", level=None) as failed:
            host.append_messages(self.agent, sid, new)
        if failed:
            return self.leave_unchanged("failed", f"adopting the live transcript failed: {failed.reason}",
                                        "warning", generation=standing.generation)
        host.rebase_flush(self.agent, sid, adopted, self.behaviour.flush_cursor)
        host.await_real_usage(self.agent)
        self.steps.adopted()
        # The conversation continues with a different list: on 0.14 the gateway's own
        # transcript bookkeeping (JSONL copy, history offset) must follow it, as after a compaction.
        self.runtime.compactions.record(sid, adopted)
        reason = (
            f"message list predates compaction generation {standing.generation or '?'}; "
            "adopted the live transcript instead of compacting again"
        )
        self.finish(self.outcome("adopted", reason, after=len(adopted)), generation=standing.generation,
                    basis=standing.basis, new_messages=len(new))
        self.pm.hook.session_guard_transcript_adopted(
            session_id=sid, op_id=self.op_id, generation=standing.generation, adopted=adopted
        )
        return adopted, host.current_system_prompt(self.agent, self.system_message)
