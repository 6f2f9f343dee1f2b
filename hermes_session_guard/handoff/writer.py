"""Bounded hand-off to a fresh session after repeated compressions.

Every compression loses detail; after ``handoff.after_compressions`` of them the
guard writes a hand-off packet (see :mod:`hermes_session_guard.handoff.packet`)
and, depending on ``handoff.mode``:

``prompt_user``
    tells the user where the packet is and how to start fresh; the session,
    its id and the gateway routing stay exactly as an ordinary compression
    leaves them.
``fresh_session``
    forks explicitly: creates a child session (``parent_session_id`` = the
    compressed session) seeded with the packet, moves the gateway's routing to
    it, switches the agent's live id, and logs ``fork.created``. The child is
    created first; if creating it, routing or switching fails, everything done
    so far is undone and the conversation continues compressed on the old id,
    without consuming the hand-off count.

At most ``handoff.max_auto_handoffs`` automatic hand-offs happen per lineage
(the chain of sessions linked by guard hand-offs); the bound is claimed in the
guard's ``session_guard_handoffs`` table inside one sqlite transaction, so it
holds across processes sharing a state.db.

Runs from the hand-off extension's ``session_guard_after_compression`` hook
(:mod:`.extension`), after the compression itself succeeded. Nothing here raises
into the host.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import host
from ..audit import AuditLog
from ..fail_open import failing_open
from ..runtime import Runtime
from ..seam_behaviour import NO_BEHAVIOUR
from ..store import GuardStore
from ..summaries.tags import tag_recorded
from .packet import (
    PacketInputs,
    last_user_request,
    latest_summary,
    open_questions,
    render_packet,
    seed_message_text,
    session_secret_values,
    snapshot_pointers,
    todos_from_messages,
    user_request_text,
    write_packet,
)
from .redaction import redact

log = logging.getLogger("hermes_session_guard")

PROMPT_USER = "prompt_user"
FRESH_SESSION = "fresh_session"
MANUAL = "manual"

SEED_ACK = (
    "Understood. I have the hand-off packet above as background reference and will continue from the "
    "latest user message."
)


@dataclass
class HandoffOutcome:
    status: str  # "not_due" | "bounded" | "prompted" | "forked" | "failed"
    child_session_id: str | None = None
    packet_path: Path | None = None


# -- collecting what goes into a packet -------------------------------------------------
def lineage_of(store: GuardStore, session_id: str) -> list[str]:
    """Root first, ending with ``session_id`` (guard hand-offs only)."""
    chain = [session_id]
    records = {r.child_session_id: r.parent_session_id for r in store.handoffs(
        lineage_root=store.lineage_root(session_id)) if r.child_session_id and r.status == "done"}
    while chain[0] in records and len(chain) < 100:
        chain.insert(0, records[chain[0]])
    return chain


def _redactor() -> Callable[[str], str]:
    """The whole redaction chain, Hermes's pass included, as one function of a text."""
    host_redactor = host.host_redactor()
    return lambda text: redact(text, host_redactor)


def collect_inputs(
    store: GuardStore,
    db: Any,
    session_id: str,
    messages: list[Any],
    *,
    agent: Any = None,
    reason: str = "",
    note: str | None = None,
    compressions: int | None = None,
) -> PacketInputs:
    row = host.session_row(db, session_id) if db is not None else None
    # Which messages are summaries: the tags, and the marks the guard stored (a
    # transcript read straight from state.db carries no tags).
    hashes, snapshot_ids = store.summary_marks([session_id])
    tag_recorded(messages, hashes, snapshot_ids, None)
    cwd = host.working_dir(row)
    branch, commit = host.git_state(cwd)
    todos = host.todo_items(agent) if agent is not None else None
    summary = latest_summary(messages)
    return PacketInputs(
        session_id=session_id,
        lineage=lineage_of(store, session_id),
        title=(row or {}).get("title"),
        working_dir=cwd,
        git_branch=branch,
        git_commit=commit,
        todos=todos if todos is not None else todos_from_messages(messages),
        summary=summary,
        last_user_request=last_user_request(messages),
        open_questions=open_questions(summary, messages, clean=_redactor()),
        snapshots=snapshot_pointers(store.list_snapshots(session_id)),
        compressions=store.compression_count(session_id) if compressions is None else compressions,
        reason=reason,
        note=note,
        created_at=time.time(),
        secret_values=session_secret_values(messages),
    )


def continuation_messages(packet: str, parent: str, compressed: list[Any]) -> list[dict[str, Any]]:
    """The child's opening transcript: the packet (as a reference user message), a
    short acknowledgement that keeps roles alternating, then the in-flight exchange
    from the latest real user message on (its tool calls and results stay paired).
    The compaction summary and todo snapshot are not repeated: they are in the packet."""
    start = None
    for i in range(len(compressed) - 1, -1, -1):
        if user_request_text(compressed[i]):
            start = i
            break
    tail: list[dict[str, Any]] = []
    if start is not None:
        first = dict(compressed[start])
        text = user_request_text(first)
        if text != first.get("content"):
            first["content"] = text  # a summary was merged into it; the packet carries the summary
        tail.append(first)
        for m in compressed[start + 1:]:
            if not isinstance(m, dict):
                continue
            if m.get("role") == "user" and user_request_text(m) is None:
                continue  # todo snapshot / summary re-appended by the host
            tail.append(m)
    return [
        {"role": "user", "content": seed_message_text(packet, parent)},
        {"role": "assistant", "content": SEED_ACK},
        *tail,
    ]


# -- telling the user ----------------------------------------------------------------
def _tell_user(runtime: Runtime, agent: Any, routed_session: str, text: str) -> None:
    """A gateway chat gets the notice as a message of its own, sent by the
    gateway-turn seam around the turn (a status bubble may be edited away by the
    next status, and gateway hygiene's agent has no status channel at all);
    elsewhere (CLI) it goes through the agent's status output."""
    if host.gateway_routes_to(routed_session):
        runtime.notices.add(routed_session, text)
    else:
        host.emit_status(agent, text)


def prompt_text(path: Path, count: int) -> str:
    return (
        f"📝 This conversation has been compacted {'once' if count == 1 else f'{count} times'} and detail is "
        "getting lost. "
        f"A hand-off packet is saved at `{path}`. To start fresh, send /new and share the packet "
        "(or its path) in the new conversation."
    )


def fork_text(child: str, parent: str, path: Path) -> str:
    return (
        f"🔀 After repeated compactions this conversation continues in a fresh session {child} "
        f"(continuing {parent}); the hand-off packet is at `{path}`."
    )


# -- the automatic path ---------------------------------------------------------------
def after_compression(
    runtime: Runtime, agent: Any, session_id: str, op_id: str, compressed: list[Any]
) -> HandoffOutcome | None:
    """Decide and perform the automatic hand-off for one successful compression.
    Never raises: any guard error leaves the ordinary compressed continuation."""
    cfg = runtime.config.handoff
    if not cfg.enabled or agent is None or not session_id or host.persistence_disabled(agent):
        return None
    with failing_open(f"hand-off for {session_id}",
                      "the conversation continues compressed on the same session") as failed:
        with host.session_db_for(agent) as db:
            return _after_compression(runtime, agent, db, session_id, op_id, compressed)
    runtime.audit.operation(session_id, op_id).warning(
        "handoff.failed", stage="decide", reason=failed.reason, fallback="compressed continuation",
    )
    return HandoffOutcome("failed")


def _after_compression(
    runtime: Runtime, agent: Any, db: Any, sid: str, op_id: str, compressed: list[Any]
) -> HandoffOutcome:
    cfg = runtime.config.handoff
    store = runtime.store_for(host.db_path(agent))
    count = store.compression_count(sid, store.last_auto_handoff_at(sid))
    if count < cfg.after_compressions:
        return HandoffOutcome("not_due")
    audit = runtime.audit.operation(sid, op_id)
    root = store.lineage_root(sid)
    handoff_id = uuid.uuid4().hex
    seq = store.reserve_handoff(
        handoff_id=handoff_id, lineage_root=root, parent_session_id=sid, mode=cfg.mode,
        limit=cfg.max_auto_handoffs, op_id=op_id, stale_after=runtime.config.lock.lease_seconds,
        once_per_parent=cfg.mode == FRESH_SESSION,
    )
    if seq is None:
        audit.info("handoff.bounded", compressions=count, lineage_root=root,
                   max_auto_handoffs=cfg.max_auto_handoffs, mode=cfg.mode)
        return HandoffOutcome("bounded")

    def fail(stage: str, exc: BaseException) -> HandoffOutcome:
        with failing_open(f"releasing hand-off reservation {handoff_id}",
                          "the reservation holds the count until it goes stale", advice=None):
            store.release_handoff(handoff_id)
        reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "session guard: %s hand-off of %s failed at %s (%s); continuing compressed on %s, hand-off count "
            "not consumed.", cfg.mode, sid, stage, reason, sid,
        )
        audit.warning("handoff.failed", stage=stage, reason=reason, mode=cfg.mode, handoff_seq=seq,
                      fallback="compressed continuation", count_consumed=False)
        return HandoffOutcome("failed")

    with failing_open(f"the hand-off packet of {sid}", "continuing compressed", level=None) as failed:
        inputs = collect_inputs(store, db, sid, compressed, agent=agent, compressions=count,
                                reason=f"automatic, after {count} compression{'' if count == 1 else 's'}")
        packet = render_packet(inputs, host.host_redactor())
        path = write_packet(runtime.home, cfg.artifact_dir, sid, packet, inputs.created_at)
    if failed.exc is not None:
        return fail("packet", failed.exc)
    audit.info("handoff.packet_written", path=str(path), mode=cfg.mode, handoff_seq=seq, lineage_root=root,
               compressions=count)

    if cfg.mode == PROMPT_USER:
        with failing_open(f"recording the hand-off of {sid}", "continuing compressed", level=None) as failed:
            store.complete_handoff(handoff_id, child_session_id=None, packet_path=str(path))
        if failed.exc is not None:
            return fail("record", failed.exc)
        _tell_user(runtime, agent, sid, prompt_text(path, count))
        audit.info("handoff.prompted", path=str(path), handoff_seq=seq)
        return HandoffOutcome("prompted", packet_path=path)
    return _fork(runtime, agent, store, db, sid, op_id, compressed, packet, path, handoff_id, seq, root, fail)


def _fork(
    runtime: Runtime, agent: Any, store: GuardStore, db: Any, sid: str, op_id: str, compressed: list[Any],
    packet: str, path: Path, handoff_id: str, seq: int, root: str, fail: Callable[[str, BaseException], HandoffOutcome],
) -> HandoffOutcome:
    child = host.new_session_id()
    while host.session_row(db, child) is not None:  # never adopt (or roll back) an existing session
        child = host.new_session_id()
    seeded = continuation_messages(packet, sid, compressed)
    undo: list[Any] = []
    stage = "create_child"
    with failing_open(f"the hand-off of {sid} to {child}", "continuing compressed", level=None) as failed:
        try:
            order = runtime.behaviour.get("compression", NO_BEHAVIOUR).transcript_order
            host.create_child_session(db, agent, sid, child, seeded, host.system_prompt_of(agent),
                                      transcript_order=order)
        finally:
            undo.append(lambda: host.discard_session(db, child))
        stage = "turn_lease"
        release = host.carry_turn_lease(db, agent, child, given_back=runtime.seam_patched("turn_history"))
        if release is not None:
            undo.append(release)
        stage = "routing"
        routing = host.move_gateway_routing(sid, child)
        if routing is not None:
            undo.append(routing.undo)
        stage = "record"
        store.complete_handoff(handoff_id, child_session_id=child, packet_path=str(path))
        stage = "switch"
        undo.append(host.switch_agent_session(agent, child, seeded))
    if failed.exc is not None:
        for step in reversed(undo):
            with failing_open(f"undoing hand-off of {sid} to {child}", "the other undo steps still run",
                              advice=None):
                step()
        return fail(stage, failed.exc)

    # Committed: the child exists, routing and the agent point at it.
    compressed[:] = seeded
    with failing_open(f"marking {sid} ended after its hand-off", "the hand-off stands and the parent stays "
                      "open in state.db", advice=None, level=logging.WARNING):
        host.end_session(db, sid, "handoff")
    host.notify_handoff(agent, child, sid)
    runtime.compactions.record_fork(sid, child)
    keys = routing.keys if routing is not None else []
    runtime.audit.operation(sid, op_id).info(
        "fork.created", parent_session_id=sid, child_session_id=child, handoff_seq=seq, lineage_root=root,
        packet_path=str(path), gateway_keys=len(keys), messages_seeded=len(seeded),
        max_auto_handoffs=runtime.config.handoff.max_auto_handoffs,
    )
    _tell_user(runtime, agent, child, fork_text(child, sid, path))
    return HandoffOutcome("forked", child_session_id=child, packet_path=path)


# -- on request (slash command, CLI) -----------------------------------------------------
def write_requested_packet(
    runtime_or_none: Runtime | None, session_id: str, note: str | None, *, via: str, home: Path | None = None,
) -> Path:
    """Write a packet for ``session_id`` from what state.db holds, without switching
    anything and without counting against ``max_auto_handoffs``. Raises
    :class:`~hermes_session_guard.handoff.packet.PathEscapeError` for a directory
    outside ``HERMES_HOME`` and ``LookupError`` for an unknown session."""
    from ..config import load_config
    from ..hostinfo import hermes_home, state_db_path

    home = home or (runtime_or_none.home if runtime_or_none is not None else hermes_home())
    cfg = runtime_or_none.config if runtime_or_none is not None else load_config(home)
    db_file = state_db_path(home)
    store = runtime_or_none.store_for(db_file) if runtime_or_none is not None else GuardStore(db_file)
    db = host.open_session_db(db_file)
    try:
        if host.session_row(db, session_id) is None:
            raise LookupError(f"no session {session_id} in {db_file}")
        messages = host.session_messages(db, session_id)
        inputs = collect_inputs(store, db, session_id, messages, reason=f"requested via {via}", note=note)
        packet = render_packet(inputs, host.host_redactor())
        path = write_packet(home, cfg.handoff.artifact_dir, session_id, packet, inputs.created_at)
        store.record_packet(handoff_id=uuid.uuid4().hex, session_id=session_id, mode=MANUAL,
                            packet_path=str(path))
    finally:
        with failing_open("closing state.db after a requested packet", "the connection is left to be collected",
                          advice=None, level=logging.DEBUG):
            db.close()
        if runtime_or_none is None:
            store.close()
    if runtime_or_none is not None:
        audit = runtime_or_none.audit
    else:
        audit = AuditLog.for_home(home, cfg.audit.path)
    audit.operation(session_id).info("handoff.packet_written", path=str(path), mode=MANUAL, via=via)
    return path
