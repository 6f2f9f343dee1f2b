"""The session-stability contract for one compression, as a plain function.

``guarded_compression`` knows nothing about wrapt; the seam wrapper hands it the
agent, the message list and a ``call_host`` callable that runs Hermes's own
compression. How the host is kept from rotating the id is a *strategy* named by
the seam table row for the installed version:

``detach_db``
    (0.13-0.17) the host runs with its SessionDB detached, so its rotation block
    cannot run; the guard then persists the compacted transcript under the same
    id, re-bases the flush cursor and sends the boundary notifications. Where the
    host has a native state.db lock (0.16-0.17, ``lock: native``) the guard takes
    it for the whole operation, since the detached host skips it.
``host_in_place``
    (0.18.2+) the host's own in-place path is forced on; it keeps the id,
    archives the old rows and takes its native lock.

In both cases the pre-compression transcript is stored verbatim as a snapshot
``<id>.snapshot.<UTC ts>`` in the guard's own tables (and enters the recall
index), and the audit log gets one ``compression.*`` event per step, all naming
the same session id.

Summaries: before the host persists the compacted list, every summary in it is
tagged ``is_compressed_summary`` (plus the host's own flag where it has one) and
each new summary gets the line ``[Original context: session <id>, turns <a>–<b>,
snapshot <snapshot_id>]`` after its first line. The tags are recorded in
``session_guard_summaries`` so a reload can put them back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from . import host_adapter as host
from .audit import new_op_id
from .hooks import get_plugin_manager
from .recall import recall_text
from .runtime import Runtime
from .store import message_text, text_hash
from .summaries import compacted_range, decorate_summaries, summary_indices, tag

DETACH_DB = "detach_db"
HOST_IN_PLACE = "host_in_place"
STRATEGIES = (DETACH_DB, HOST_IN_PLACE)

log = logging.getLogger("hermes_session_guard")


@dataclass
class CompressionOutcome:
    session_id: str
    session_id_after: str
    op_id: str
    status: str  # "done" | "skipped" | "failed"
    snapshot_id: str | None
    messages_before: int
    messages_after: int
    reason: str = ""


def _no_progress(before: list[Any], after: list[Any], original: list[Any]) -> bool:
    return after is original or len(after) >= len(before) and after == before


def _unchanged(messages: list[Any], before: list[Any]) -> list[Any]:
    """The caller's own list, restored if the host mutated it (identity is kept:
    later hosts track flushed messages by ``id()``)."""
    if messages != before:
        messages[:] = before
    return messages


_active = threading.local()


def compressing_session() -> str | None:
    """The session whose compression this thread is running (the host rebuilds the
    system prompt inside it, before the snapshot exists)."""
    return getattr(_active, "session_id", None)


def snapshot_id_for(session_id: str, created_at: float, exists: Callable[[str], bool]) -> str:
    """The derived snapshot id; a numeric suffix keeps it unique when two
    compressions of one session share a timestamp (frozen clocks, fast hosts)."""
    base = get_plugin_manager().hook.session_guard_snapshot_id(session_id=session_id, created_at=created_at)
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
    behaviour: Mapping[str, str] | None = None,
    system_message: str | None = None,
    native_summary_key: str | None = None,
) -> tuple[list[Any], str]:
    """Run one host compression under the contract; returns the host's result shape.

    ``behaviour`` is the seam row's version data (``flush_cursor``, ``lock``, ...);
    ``system_message`` is the host call's own argument (needed only to answer a
    skipped call the way the host would); ``native_summary_key`` is the host's own
    summary flag, on hosts that have one."""
    behaviour = behaviour or {}
    sid = host.session_id(agent)
    if not sid or not isinstance(messages, list):
        return call_host()
    op_id = new_op_id()
    audit = runtime.audit.operation(sid, op_id)
    pm = get_plugin_manager()
    before = [dict(m) if isinstance(m, dict) else m for m in messages]
    started = time.perf_counter()
    db_path = host.db_path(agent)
    store = runtime.store_for(db_path)
    runtime.remember_session(sid, db_path)
    audit.info("compression.started", messages=len(before), strategy=strategy, host_version=runtime.host_version)

    def finish(outcome: CompressionOutcome, level: str = "info", **extra: Any) -> None:
        getattr(audit, level)(
            f"compression.{outcome.status}",
            session_id_after=outcome.session_id_after,
            messages_before=outcome.messages_before,
            messages_after=outcome.messages_after,
            snapshot_id=outcome.snapshot_id,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
            reason=outcome.reason or None,
            **extra,
        )

    # The snapshot id is fixed before the host runs: the summary's recall line names
    # it, and on 0.18.2+ the host persists the summary itself.
    created_at = time.time()
    snapshot_id = snapshot_id_for(sid, created_at, store.snapshot_exists)
    summaries_cfg = runtime.config.summaries

    span: list[tuple[int, int] | None] = [None]

    def decorate(engine_input: list[Any], engine_output: list[Any]) -> None:
        span[0] = compacted_range(engine_input, engine_output)
        decorate_summaries(
            engine_input, engine_output, session_id=sid, snapshot_id=snapshot_id,
            header=summaries_cfg.recall_header, native_key=native_summary_key,
        )

    # Detaching the SessionDB also skips the host's own state.db lock (0.16-0.17):
    # take it here, the way the host would have, for the whole operation.
    native_lock = strategy == DETACH_DB and behaviour.get("lock") == "native"
    lock = host.native_compression_lock(agent, sid) if native_lock else nullcontext((True, None))
    with host.pinned_log_context(sid), lock as (held, holder):
        if not held:
            reason = "another path holds the host's compression lock on this session"
            finish(CompressionOutcome(sid, host.session_id(agent), op_id, "skipped", None, len(before),
                                      len(before), reason), holder=holder)
            return _unchanged(messages, before), host.unchanged_system_prompt(agent, system_message)
        pm.hook.session_guard_before_compression(session_id=sid, op_id=op_id, messages=messages)
        previous = compressing_session()
        _active.session_id = sid
        try:
            with host.watching_engine(agent, decorate) as verdict:
                if strategy == DETACH_DB:
                    with host.detached_session_db(agent):
                        compressed, system_prompt = call_host()
                else:
                    with host.forced_in_place(agent):
                        compressed, system_prompt = call_host()
        except BaseException as exc:
            outcome = CompressionOutcome(sid, host.session_id(agent), op_id, "failed", None, len(before),
                                         len(before), f"{type(exc).__name__}: {exc}")
            finish(outcome, "warning")
            pm.hook.session_guard_compression_failed(session_id=sid, op_id=op_id, reason=outcome.reason)
            raise
        finally:
            _active.session_id = previous

        failure = verdict.failure
        if failure or _no_progress(before, compressed, messages):
            # Nothing was persisted (detached) or the host left the rows alone.
            status = "failed" if failure else "skipped"
            reason = failure or "host made no progress (lock held elsewhere, cooldown or nothing to compress)"
            outcome = CompressionOutcome(sid, host.session_id(agent), op_id, status, None, len(before),
                                         len(before), reason)
            finish(outcome, "warning" if failure else "info")
            if failure:
                pm.hook.session_guard_compression_failed(session_id=sid, op_id=op_id, reason=reason)
            return _unchanged(messages, before), system_prompt

        # The host may have copied the dicts after the engine returned them.
        marks = []
        for i in summary_indices(compressed):
            tag(compressed[i], native_summary_key)
            marks.append((i, text_hash(message_text(compressed[i]))))
        try:
            store.write_snapshot(
                snapshot_id=snapshot_id,
                session_id=sid,
                messages=before,
                op_id=op_id,
                host_version=runtime.host_version,
                host_mode=strategy,
                created_at=created_at,
                index_text=recall_text,
            )
            if strategy == DETACH_DB:
                host.commit_memory(agent, before)
                host.persist_compacted(agent, sid, compressed, system_prompt,
                                      flush_cursor=behaviour.get("flush_cursor"),
                                      transcript_order=behaviour.get("transcript_order"))
        except Exception as exc:
            reason = f"guard persistence failed: {type(exc).__name__}: {exc}"
            if strategy == DETACH_DB:
                # Fail closed: nothing reached the live transcript, so keep the
                # uncompressed conversation rather than a compaction that was never stored.
                outcome = CompressionOutcome(sid, sid, op_id, "failed", None, len(before), len(before), reason)
                finish(outcome, "warning")
                pm.hook.session_guard_compression_failed(session_id=sid, op_id=op_id, reason=reason)
                return _unchanged(messages, before), system_prompt
            # The host already compacted in place and archived the old rows itself.
            audit.warning("snapshot.failed", reason=reason)
            snapshot_id = None
        if strategy == DETACH_DB:
            host.notify_boundary(agent, sid)
        if snapshot_id is not None:
            runtime.note_snapshot(sid, db_path)
        try:
            first, last = span[0] or (None, None)
            store.record_summaries(sid, snapshot_id, [(i, h, first, last) for i, h in marks], created_at)
        except Exception as exc:  # the tags stay on the live list; only a reload loses them
            audit.warning("summaries.record_failed", reason=f"{type(exc).__name__}: {exc}")
        outcome = CompressionOutcome(sid, host.session_id(agent), op_id, "done", snapshot_id, len(before),
                                     len(compressed), "")
        runtime.compactions.record(sid, compressed)
        finish(outcome, summary_positions=[i for i, _ in marks])

    # Outside the pinned log context: an extension may move the conversation on
    # (an explicit, logged hand-off fork), and the tag must then follow it.
    try:
        pm.hook.session_guard_after_compression(
            session_id=sid, op_id=op_id, snapshot_id=snapshot_id, compressed=compressed, agent=agent
        )
    except Exception as exc:
        log.error("session guard: an after-compression extension failed (%s: %s); the compression of %s "
                  "stands.", type(exc).__name__, exc, sid)
    return compressed, system_prompt
