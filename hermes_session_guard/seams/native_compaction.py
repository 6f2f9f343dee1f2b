"""Native mode (Hermes 0.20+): Hermes compacts in place under its own lock; the guard adds
what Hermes lacks and takes nothing over.

From 0.20 Hermes keeps the id by default (``compression.in_place``), serialises the
compressions of one session with a lease it checks inside its own commit
(``archive_and_compact(..., lock_holder=)``), reclaims a dead holder's lease, re-sequences
messages that arrive during the summary call after the compacted set (its watermark)
and keeps the pre-compaction rows archived in ``messages`` (``active = 0, compacted = 1``).
The guard verifies those promises in its tests and does not duplicate them: it takes no
lock, re-enters none, detaches nothing and carries no messages over. Around Hermes's own
call it

* pins the operation's log context and op id, and records the ``compression.*`` audit
  events and the ``session_guard_compressions`` row (started -> outcome);
* keeps ``compression_in_place`` on for the call (a ``false`` in config.yaml would rotate
  the id, promise 1);
* tags each summary ``is_compressed_summary`` (besides Hermes's ``_compressed_summary``),
  gives it the recall line and records it for reloads (through the engine shim, before
  Hermes persists it);
* records the snapshot as a reference to the rows Hermes archived (row-id range, count
  and digest), not a second copy.

A guard error before Hermes runs steps aside (the compression runs as without the guard,
in place, with one ERROR line); one after Hermes ran leaves Hermes's result standing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import host
from ..audit import new_op_id
from ..hooks.manager import get_plugin_manager
from ..host import engines as engine_support
from ..runtime import Runtime
from ..seam_behaviour import Strategy
from ..store import message_text, text_hash
from ..summaries.tags import compacted_range, decorate_summaries, remember_summary, summary_indices, tag
from .compression import CompressionOutcome, compressing_scope, snapshot_id_for

log = logging.getLogger("hermes_session_guard")


def native_compression(
    runtime: Runtime,
    agent: Any,
    messages: list[Any],
    call_host: Callable[[], tuple[list[Any], str]],
    *,
    native_summary_key: str | None,
) -> tuple[list[Any], str]:
    """One compression on a native-mode host: Hermes's own, observed and completed."""
    sid = host.session_id(agent)
    if not sid or not isinstance(messages, list):
        return call_host()
    return _NativeOperation(runtime, agent, sid, messages, call_host, native_summary_key).run()


class _NativeOperation:
    def __init__(self, runtime: Runtime, agent: Any, sid: str, messages: list[Any],
                 call_host: Callable[[], tuple[list[Any], str]], native_summary_key: str | None) -> None:
        self.runtime, self.agent, self.sid, self.call_host = runtime, agent, sid, call_host
        self.native_key = native_summary_key
        self.before = [dict(m) if isinstance(m, dict) else m for m in messages]
        self.before_count = len(messages)
        self.op_id = new_op_id()
        self.audit = runtime.audit.operation(sid, self.op_id)
        self.db_path = host.db_path(agent)
        self.store = runtime.store_for(self.db_path)
        runtime.remember_session(sid, self.db_path)
        self.started = time.perf_counter()
        self.rows: list[tuple[int, int]] = []  # live row ids when the engine returned: the transcript before
        self.span: tuple[int, int] | None = None
        self.produced: set[str] = set()
        self.outcome: CompressionOutcome | None = None
        self.done: tuple[str | None, list[Any]] | None = None

    def run(self) -> tuple[list[Any], str]:
        result = self._run_pinned()
        if self.done is not None:
            # Outside the pinned log context: an extension may move the conversation on
            # (an explicit, logged hand-off), and the tag must follow it.
            snapshot_id, compressed = self.done
            try:
                get_plugin_manager().hook.session_guard_after_compression(
                    session_id=self.sid, op_id=self.op_id, snapshot_id=snapshot_id, compressed=compressed,
                    agent=self.agent)
            except Exception as exc:
                log.error("session guard: an after-compression extension failed (%s: %s); the compression of %s "
                          "stands.", type(exc).__name__, exc, self.sid)
        return result

    def _run_pinned(self) -> tuple[list[Any], str]:
        with host.pinned_log_context(self.sid):
            self.audit.info("compression.started", messages=self.before_count, strategy=Strategy.HOST_NATIVE,
                            host_version=self.runtime.host_version)
            self.runtime.compressing.begin(self.sid, self.op_id)
            self._phase(self.store.begin_compression, self.op_id, self.sid, self.before_count)
            try:
                return self._compress()
            finally:
                self.runtime.compressing.end(self.sid, self.op_id)
                last = self.outcome
                self._phase(self.store.set_compression_phase, self.op_id, last.status if last else "failed",
                            snapshot_id=last.snapshot_id if last else None,
                            messages_after=last.messages_after if last else None,
                            detail=(last.reason or None) if last else "interrupted", finished=True)

    def _phase(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            write(*args, **kwargs)
        except Exception as exc:  # the durable row never fails a compression
            log.warning("session guard: could not record the compression phase of %s (%s: %s)",
                        self.sid, type(exc).__name__, exc)

    def _compress(self) -> tuple[list[Any], str]:
        created_at = time.time()
        snapshot_id = snapshot_id_for(self.sid, created_at, self.store.snapshot_exists)
        header = self.runtime.config.summaries.recall_header

        def decorate(engine_input: list[Any], engine_output: list[Any]) -> None:
            # Hermes holds its lock and took its watermark before calling the engine; the
            # live rows now are the ones its commit archives.
            self.rows = host.live_row_ranges(self.db_path, self.sid)
            self.span = compacted_range(engine_input, engine_output)
            made = [] if engine_support.builtin_family(host.context_engine(self.agent)) \
                else engine_support.produced_positions(engine_input, engine_output)
            decorate_summaries(engine_input, engine_output, session_id=self.sid, snapshot_id=snapshot_id,
                               header=header, native_key=self.native_key, produced=made)
            self.produced = {text_hash(message_text(engine_output[i])) for i in made}

        try:
            with compressing_scope(self.sid), host.watching_engine(self.agent, decorate) as verdict, \
                    host.forced_in_place(self.agent):
                compressed, system_prompt = self.call_host()
        except BaseException as exc:
            self._finish("failed", f"{type(exc).__name__}: {exc}", "warning")
            raise
        try:
            return self._settle(compressed, system_prompt, verdict.failure, snapshot_id, created_at)
        except Exception as exc:  # Hermes's compaction is committed: it stands
            self._finish("done", f"guard error after Hermes compacted: {type(exc).__name__}: {exc}; the compaction "
                         "stands", "error", after=len(compressed) if isinstance(compressed, list) else None,
                         hint="Run `hermes-session-guard selftest`.")
            return compressed, system_prompt

    def _settle(self, compressed: list[Any], system_prompt: str, failure: str | None, snapshot_id: str,
                created_at: float) -> tuple[list[Any], str]:
        if failure:
            self._finish("failed", failure, "warning")
            get_plugin_manager().hook.session_guard_compression_failed(session_id=self.sid, op_id=self.op_id,
                                                                       reason=failure)
            return compressed, system_prompt
        if not host.compacted_in_place(self.agent):
            reason = getattr(self.agent, "_compression_skipped_due_to_lock", None)
            why = "Hermes's own lock is held by another compression of this session" if reason else \
                "Hermes made no in-place compaction (nothing to compress, cooldown, or its commit failed; see its log)"
            self._finish("skipped", why, holder=str(reason) if isinstance(reason, str) else None)
            return compressed, system_prompt
        marks = []
        produced = [i for i, m in enumerate(compressed)
                    if self.produced and isinstance(m, dict) and text_hash(message_text(m)) in self.produced]
        for i in sorted({*summary_indices(compressed, self.before), *produced}):
            tag(compressed[i], self.native_key)
            remember_summary(message_text(compressed[i]))
            marks.append((i, text_hash(message_text(compressed[i]))))
        recorded: str | None = None
        if self.rows:
            try:
                self.store.write_snapshot_reference(
                    snapshot_id=snapshot_id, session_id=self.sid, row_runs=self.rows, op_id=self.op_id,
                    host_version=self.runtime.host_version, host_mode=Strategy.HOST_NATIVE, created_at=created_at,
                )
                recorded = snapshot_id
                self.runtime.note_snapshot(self.sid, self.db_path)
            except Exception as exc:
                self.audit.warning("snapshot.failed", reason=f"{type(exc).__name__}: {exc}")
        try:
            first, last = self.span or (None, None)
            self.store.record_summaries(self.sid, recorded, [(i, h, first, last) for i, h in marks], created_at)
        except Exception as exc:
            self.audit.warning("summaries.record_failed", reason=f"{type(exc).__name__}: {exc}")
        self.runtime.compactions.record(self.sid, compressed)
        self._finish("done", after=len(compressed), snapshot_id=recorded,
                     summary_positions=[i for i, _ in marks],
                     snapshot_rows=",".join(f"{a}-{b}" for a, b in self.rows) or None)
        self.done = (recorded, compressed)
        return compressed, system_prompt

    def _finish(self, status: str, reason: str = "", level: str = "info", *, after: int | None = None,
                snapshot_id: str | None = None, **extra: Any) -> None:
        n = self.before_count
        self.outcome = CompressionOutcome(self.sid, host.session_id(self.agent), self.op_id, status, snapshot_id, n,
                                          n if after is None else after, reason)
        getattr(self.audit, level)(
            f"compression.{status}", session_id_after=self.outcome.session_id_after,
            messages_before=n, messages_after=self.outcome.messages_after, snapshot_id=snapshot_id,
            duration_ms=round((time.perf_counter() - self.started) * 1000, 2), reason=reason or None,
            lock="host", **{k: v for k, v in extra.items() if v is not None},
        )
