"""Writing a compacted transcript back through the agent's SessionDB and
re-basing the host's flush cursor so the next turn appends after it."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..store import message_text
from .agent import session_db
from .reads import live_rows_brief, runs_of


def in_timestamp_order(db: Any, floor_session: str, messages: list[Any]) -> list[Any]:
    """Copies of ``messages`` whose timestamps keep them, in order, before anything
    the turn appends afterwards, for hosts that load a transcript ``ORDER BY
    timestamp`` (0.17). Without them the rows would be stamped "now", after the
    turn's own user message, which the host stamps with its arrival time. They
    start at the first timestamp of ``floor_session`` (the conversation being
    compacted or handed off); a message's own timestamp is kept where it has one
    and still fits the order."""
    with failing_open(f"reading the first timestamps of {floor_session}", 'the messages are ordered from "now"',
                      level=logging.DEBUG, advice=None) as failed:
        known = [float(r["timestamp"]) for r in db.get_messages(floor_session) if r.get("timestamp") is not None]
    if failed:
        known = []
    last = (min(known) if known else time.time()) - 1e-6
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        try:
            ts = float(m["timestamp"]) if m.get("timestamp") is not None else None
        except (TypeError, ValueError):
            ts = None
        last = ts if ts is not None and ts > last else last + 1e-6
        out.append({**m, "timestamp": last})
    return out


def persist_compacted(
    agent: Any, sid: str, compressed: list[Any], system_prompt: str | None, *, flush_cursor: str | None = None,
    transcript_order: str | None = None,
) -> None:
    """Make ``compressed`` the live transcript of ``sid`` and re-base the flush cursor
    so the next turn appends after it (the host skipped all of this: its DB was detached).
    ``transcript_order`` is how the host loads a transcript back (``id`` or ``timestamp``)."""
    db = session_db(agent)
    if db is None:
        return
    rows = in_timestamp_order(db, sid, compressed) if transcript_order == "timestamp" else compressed
    db.replace_messages(sid, rows)
    if system_prompt:
        with failing_open(f"update_system_prompt({sid})", "the session row keeps its previous system prompt",
                          level=logging.DEBUG, advice=None):
            db.update_system_prompt(sid, system_prompt)
    rebase_flush(agent, sid, compressed, flush_cursor)


def rebase_flush(agent: Any, sid: str, persisted: list[Any], kind: str | None = None) -> None:
    """Tell the agent that ``persisted`` is exactly what state.db holds live for
    ``sid``. ``kind`` is the row's ``flush_cursor``: ``index`` hosts (0.13-0.16)
    slice at ``_last_flushed_db_idx``; ``identity`` (0.17) and ``marker`` (0.18.2+)
    hosts skip the ``id()`` of every dict in ``_flushed_db_message_ids`` while
    ``_flushed_db_message_session_id`` names the session, and reset that set
    otherwise, so both are set even on an agent that never flushed (0.18.2+ take
    the set as a one-shot seed). ``None`` (no row data): whatever the agent has."""
    identity = kind in ("identity", "marker") if kind else hasattr(agent, "_flushed_db_message_ids")
    if identity:
        agent._last_flushed_db_idx = len(persisted)
        agent._flushed_db_message_ids = {id(m) for m in persisted if isinstance(m, dict)}
        agent._flushed_db_message_session_id = sid
        return
    # A positional cursor: Hermes's alternation repair folds consecutive same-role
    # turns in place before the next request, shortening the list under the cursor;
    # without the allowance the turn's reply would fall behind it and never be written.
    agent._last_flushed_db_idx = len(persisted) - repairs_pending(agent, persisted)
    if hasattr(agent, "_flushed_db_message_session_id"):
        agent._flushed_db_message_session_id = sid


def repairs_pending(agent: Any, messages: list[Any]) -> int:
    """How many messages Hermes's alternation repair will fold away in ``messages``
    before the next request (tried on a copy)."""
    repair = getattr(agent, "_repair_message_sequence", None)
    if not callable(repair):
        return 0
    trial = [dict(m) if isinstance(m, dict) else m for m in messages]
    with failing_open("the trial alternation repair", "the flush cursor allows for no folds", level=logging.DEBUG,
                      advice=None) as failed:
        repair(trial)
    if failed:
        return 0
    return max(0, len(messages) - len(trial))


# Rows Hermes stores in a transcript that are not conversation turns: the gateway's
# ``session_meta`` marker (tool list, model, platform) and system injections. The
# gateway drops them before handing history to an agent, so an agent's list never has them.
_TRANSCRIPT_METADATA_ROLES = frozenset({"session_meta", "system"})


def live_transcript(agent: Any, sid: str, leave_out_row: int | None = None) -> list[dict[str, Any]]:
    """The conversation Hermes would hand an agent for ``sid``: its active rows in
    conversation format, without metadata rows (see ``_TRANSCRIPT_METADATA_ROLES``), without
    prompts still waiting in an entry point's queue (see :func:`_queued_prompt_row`) and
    without the row ``leave_out_row`` (its id in ``messages``)."""
    db = session_db(agent)
    if db is None:
        return []
    if leave_out_row is None:
        rows = db.get_messages_as_conversation(sid)
    else:
        rows = [{k: v for k, v in m.items() if k != "_row_id"}
                for m in db.get_messages_as_conversation(sid, include_row_ids=True)
                if not (isinstance(m, dict) and m.get("_row_id") == leave_out_row)]
    queued = _queued_prompt_row()
    return [m for m in rows if not (isinstance(m, dict) and (m.get("role") in _TRANSCRIPT_METADATA_ROLES
                                                             or queued(m)))]


def live_brief(agent: Any, sid: str, leave_out_row: int | None = None,
               include_row_ids: bool = False) -> list[dict[str, Any]] | None:
    """The messages :func:`live_transcript` gives, each reduced to ``role``, ``content`` and
    ``tool_call_id`` as stored, read straight from state.db: enough to compare by key
    (``contract.generations.message_key``) at a fraction of the cost of Hermes's loader on a
    long session. Only a positive answer may be taken from it ("these are the messages the
    agent holds"): a row Hermes's loader reads differently (decoded content) keys
    differently here, so a difference means "read :func:`live_transcript`". None when the
    read fails or a display marker cannot be decoded. ``include_row_ids``: each message also
    has its row's id under ``_row_id``, as Hermes's loader gives it."""
    return _brief(agent, sid, leave_out_row, include_row_ids, with_runs=False)[0]


def live_brief_and_runs(agent: Any, sid: str) -> tuple[list[dict[str, Any]] | None, list[tuple[int, int]]]:
    """:func:`live_brief` with row ids, and the ids of every live row of the session
    (metadata rows and queued prompts too) as runs, as ``reads.live_row_ranges`` gives
    them: one read for both. ``(None, [])`` when the read fails."""
    return _brief(agent, sid, None, True, with_runs=True)


def _brief(agent: Any, sid: str, leave_out_row: int | None, include_row_ids: bool,
           with_runs: bool) -> tuple[list[dict[str, Any]] | None, list[tuple[int, int]]]:
    """The brief and, ``with_runs`` (else ``[]``: a turn's start asks only for the brief), the runs."""
    db = session_db(agent)
    if db is None:
        return [], []
    path = getattr(db, "db_path", None)  # the SessionDB's own file, never a default one
    rows = live_rows_brief(Path(path), sid, tuple(sorted(_TRANSCRIPT_METADATA_ROLES))) if path else None
    if rows is None:
        return None, []
    runs = runs_of([row[0] for row in rows]) if with_runs else []
    queued = _queued_prompt_row()
    out = []
    for row_id, role, content, call, meta in rows:
        if row_id == leave_out_row or role in _TRANSCRIPT_METADATA_ROLES:
            continue
        message = {"role": role, "content": content, "tool_call_id": call}
        if include_row_ids:
            message["_row_id"] = row_id
        if meta:
            try:
                message["display_metadata"] = json.loads(meta)
            except (TypeError, ValueError):
                return None, runs
            if queued(message):
                continue
        out.append(message)
    return out, runs


@functools.cache
def _queued_prompt_row() -> Callable[[dict[str, Any]], bool]:
    """Whether a conversation message is the row of a prompt still waiting in a queue: 0.21+'s
    TUI writes a busy prompt's row when it accepts it, marked in ``display_metadata``
    (``hermes_state_common.QUEUED_PROMPT_METADATA_KEY``), and writes it again unmarked when
    the prompt's turn starts; a reopen retires rows still marked (#125577). Never on a
    release without the mark. Decided once per process: every turn's live read asks, and
    Python does not remember a failed import."""
    try:
        from hermes_state_common import QUEUED_PROMPT_METADATA_KEY as mark
    except ImportError:
        return lambda _m: False

    def queued(m: dict[str, Any]) -> bool:
        meta = m.get("display_metadata")
        return m.get("role") == "user" and isinstance(meta, dict) and bool(meta.get(mark))

    return queued


def staged_turn_row(agent: Any) -> int | None:
    """The row id of the user message of the turn ``agent`` is about to run when its entry
    point wrote that row already: 0.21+'s TUI writes a prompt when it is sent (#111868) and
    stages the row on the agent (``_pending_cli_user_message``, with its ``_row_id``) for
    the turn to adopt instead of writing it again. None otherwise."""
    staged = getattr(agent, "_pending_cli_user_message", None)
    row = staged.get("_row_id") if isinstance(staged, dict) else None
    return row if isinstance(row, int) and not isinstance(row, bool) else None


def carried_unpersisted(history: list[Any]) -> list[dict[str, Any]]:
    """Messages of ``history`` Hermes marks as held in memory only until the turn persists
    them (0.22: ``_PERSIST_AFTER_ADMISSION_INTERRUPT``); none on a release without the mark."""
    try:
        from agent.session_persistence import _PERSIST_AFTER_ADMISSION_INTERRUPT as mark
    except ImportError:
        return []
    return [m for m in history if isinstance(m, dict) and m.get(mark) and "_row_id" not in m]


_APPEND_FIELDS = (
    "tool_name", "tool_calls", "tool_call_id", "finish_reason", "reasoning", "reasoning_content",
    "reasoning_details", "codex_reasoning_items", "codex_message_items",
)


def append_messages(agent: Any, sid: str, messages: list[Any]) -> None:
    """Append ``messages`` to ``sid``'s live transcript through Hermes's own API."""
    db = session_db(agent)
    if db is None or not messages:
        return
    accepted = set(inspect.signature(db.append_message).parameters)
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            content = message_text(m)
        extra = {k: m[k] for k in _APPEND_FIELDS if k in accepted and m.get(k) is not None}
        db.append_message(session_id=sid, role=str(m.get("role") or "user"), content=content, **extra)
