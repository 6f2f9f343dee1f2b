"""The session-stability contract for one compression, as a plain function.

``guarded_compression`` knows nothing about wrapt; the seam wrapper hands it the
agent, the message list and a ``call_host`` callable that runs Hermes's own
compression. How the host is kept from rotating the id is a *strategy* named by
the seam table row for the installed version:

``detach_db``
    (0.13-0.17) the host runs with its SessionDB detached, so its rotation block
    cannot run; the guard then persists the compacted transcript under the same
    id, re-bases the flush cursor and sends the boundary notifications.
``host_in_place``
    (0.18.2+) the host's own in-place path is forced on; it keeps the id,
    archives the old rows and takes its native lock.

In both cases the pre-compression transcript is stored verbatim as a snapshot
``<id>.snapshot.<UTC ts>`` in the guard's own tables, and the audit log gets
one ``compression.*`` event per step, all naming the same session id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import host_adapter as host
from .audit import new_op_id
from .hooks import get_plugin_manager
from .runtime import Runtime

log = logging.getLogger("hermes_session_guard")

DETACH_DB = "detach_db"
HOST_IN_PLACE = "host_in_place"
STRATEGIES = (DETACH_DB, HOST_IN_PLACE)


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
) -> tuple[list[Any], str]:
    """Run one host compression under the contract; returns the host's result shape."""
    sid = host.session_id(agent)
    if not sid or not isinstance(messages, list):
        return call_host()
    op_id = new_op_id()
    audit = runtime.audit.operation(sid, op_id)
    before = [dict(m) if isinstance(m, dict) else m for m in messages]
    started = time.perf_counter()
    store = runtime.store_for(host.db_path(agent))
    audit.info("compression.started", messages=len(before), strategy=strategy, host_version=runtime.host_version)
    runtime.compressing.begin(sid, op_id)
    _record_phase(store.begin_compression, op_id, sid, len(before))
    op = _Operation(sid, op_id, audit, before, started, store)
    try:
        return _compress(runtime, strategy, agent, messages, call_host, op)
    finally:
        runtime.compressing.end(sid, op_id)
        last = op.outcome
        _record_phase(
            store.set_compression_phase, op_id, last.status if last else "failed",
            snapshot_id=last.snapshot_id if last else None,
            messages_after=last.messages_after if last else None,
            detail=(last.reason or None) if last else "interrupted", finished=True,
        )


def _record_phase(write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Write the durable op row; a failure here must not fail the compression."""
    try:
        write(*args, **kwargs)
    except Exception as exc:
        log.warning("session guard: could not record the compression phase in session_guard_compressions "
                    "(%s: %s); compression continues", type(exc).__name__, exc)


@dataclass
class _Operation:
    sid: str
    op_id: str
    audit: Any
    before: list[Any]
    started: float
    store: Any
    outcome: CompressionOutcome | None = None


def _compress(
    runtime: Runtime,
    strategy: str,
    agent: Any,
    messages: list[Any],
    call_host: Callable[[], tuple[list[Any], str]],
    op: _Operation,
) -> tuple[list[Any], str]:
    sid, op_id, audit, before, started, store = op.sid, op.op_id, op.audit, op.before, op.started, op.store
    pm = get_plugin_manager()

    def finish(outcome: CompressionOutcome, level: str = "info", **extra: Any) -> None:
        op.outcome = outcome
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

    with host.pinned_log_context(sid):
        pm.hook.session_guard_before_compression(session_id=sid, op_id=op_id, messages=messages)
        try:
            with host.watching_engine(agent) as verdict:
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

        created_at = time.time()
        try:
            snapshot_id = snapshot_id_for(sid, created_at, store.snapshot_exists)
            store.write_snapshot(
                snapshot_id=snapshot_id,
                session_id=sid,
                messages=before,
                op_id=op_id,
                host_version=runtime.host_version,
                host_mode=strategy,
                created_at=created_at,
            )
            if strategy == DETACH_DB:
                host.commit_memory(agent, before)
                host.persist_compacted(agent, sid, compressed, system_prompt)
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
        outcome = CompressionOutcome(sid, host.session_id(agent), op_id, "done", snapshot_id, len(before),
                                     len(compressed), "")
        runtime.compactions.record(sid, compressed)
        finish(outcome)
        pm.hook.session_guard_after_compression(
            session_id=sid, op_id=op_id, snapshot_id=snapshot_id, compressed=compressed
        )
        return compressed, system_prompt
