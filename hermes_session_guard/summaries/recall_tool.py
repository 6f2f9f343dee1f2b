"""The ``session_guard_recall`` tool and the system-prompt rule that points to it.

Which conversation is calling is never taken from the model's arguments: the
host's tool dispatcher (``handle_function_call(..., session_id=agent.session_id)``)
is wrapped by the ``tool_session`` seam, which puts that id in a context
variable for the duration of the call. 0.19 also hands the id to the handler as
``session_id``; the context variable wins when both are present.

The tool is registered with Hermes's tool registry from ``register(ctx)`` in its
own toolset ``session_guard`` (so ``hermes tools`` can switch it off), and the
``request_tools`` seam leaves it out of every request of a session that has no
snapshots yet.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..store import text_hash
from . import host_port
from .recall import Recall, recall_content, recall_text

RECALL_TOOL = "session_guard_recall"
TOOLSET = "session_guard"

SCHEMA: dict[str, Any] = {
    "name": RECALL_TOOL,
    "description": (
        "Recover the exact original text of earlier turns of THIS conversation that were compacted into a "
        "context-compaction summary: error messages, file paths, commands, config values, numbers, code. "
        "Search with words (an error code, a file or setting name, a command) and/or the turn range and "
        "snapshot named in the summary's '[Original context: session ..., turns a–b, snapshot ...]' line. "
        "Returns verbatim excerpts with their turn numbers. Only this conversation is ever searched."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "Words to look for; put an exact phrase in double quotes.",
            },
            "turn_start": {
                "type": "integer",
                "description": "First turn to return (from the [Original context] line).",
            },
            "turn_end": {"type": "integer", "description": "Last turn to return."},
            "snapshot_id": {
                "type": "string",
                "description": "Snapshot named in the [Original context] line; default: the latest.",
            },
        },
        "required": [],
    },
}

SYSTEM_RULE = (
    "## Compacted history\n"
    "Earlier turns of this conversation were compacted into a summary (the message that starts with the "
    "context-compaction notice and carries an '[Original context: ...]' line). The original turns are kept "
    "verbatim. When you need a specific detail the summary does not spell out — an exact error message, file "
    "path, command, configuration value, number or code — call the `session_guard_recall` tool (a few "
    "distinctive words and/or the turn range from that line) and use the exact text it returns. Do not guess "
    "such details and do not ask the user to repeat them."
)

_calling_session: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "session_guard_calling_session", default=None
)


@contextmanager
def calling_session(session_id: str | None) -> Iterator[None]:
    token = _calling_session.set(session_id or None)
    try:
        yield
    finally:
        _calling_session.reset(token)


def _runtime() -> Any:
    from ..runtime import current_runtime

    return current_runtime()


def available() -> bool:
    """``check_fn`` for the registry: the guard runs and recall is enabled."""
    runtime = _runtime()
    return runtime is not None and runtime.config.recall.enabled


MAX_LINEAGE = 64


def handoff_parent(store: Any, session_id: str) -> str | None:
    """The session a ``fresh_session`` hand-off forked ``session_id`` from, as the
    guard's own hand-off record names it (the lineage its packet names); None otherwise."""
    for record in store.handoffs(session_id=session_id):
        if record.child_session_id == session_id and record.status == "done" and record.parent_session_id:
            return str(record.parent_session_id)
    return None


def lineage(db_path: Path, session_id: str, store: Any = None) -> list[str]:
    """The conversation: this session, the sessions it continues after a host
    compression that rotated the id, and (given the guard's store) the sessions a
    ``fresh_session`` hand-off forked it from, with theirs in turn. Only upwards:
    never siblings, branches, children or any session no record links it to."""
    ancestors = host_port.bound().compression_ancestors
    members = [session_id, *ancestors(db_path, session_id)]
    if store is None:
        return members
    i = 0
    while i < len(members) and len(members) < MAX_LINEAGE:
        with failing_open(f"reading hand-off records of {members[i]} for recall",
                          "the conversation's own history still answers", advice=None,
                          level=logging.WARNING) as failed:
            parent = handoff_parent(store, members[i])
        if failed:
            return members
        if parent is not None and parent not in members:
            members += [parent, *(a for a in ancestors(db_path, parent) if a not in members)]
        i += 1
    return members[:MAX_LINEAGE]


def has_compacted_history(runtime: Any, session_id: str, db_path: Path) -> bool:
    """This session has snapshots, or a session of its lineage has (a hand-off child
    reaches its parent's). A positive answer is cached like a snapshot of its own."""
    if runtime.has_snapshots(session_id, db_path):
        return True
    path = Path(db_path)
    if not session_id or not path.exists():
        return False
    with failing_open(f"reading the hand-off lineage of {session_id}", "the session is taken to have no compacted "
                      "history of its lineage", advice=None, level=logging.WARNING) as failed:
        store = runtime.store_for(path)
        if handoff_parent(store, session_id) is None:
            return False
        members = lineage(path, session_id, store)
    if failed:
        return False
    if any(runtime.has_snapshots(member, path) for member in members[1:]):
        runtime.note_snapshot(session_id, path)
        return True
    return False


def refresh_archived(store: Any, db_path: Path, session_id: str, members: list[str]) -> None:
    """Index Hermes's own rows of the lineage that the guard has not seen yet: the
    session's archived (compacted in place / rewound) rows and every row of the
    sessions it continues."""
    for member in members:
        newest = host_port.bound().last_row_id(db_path, member)
        seen = store.archived_seen(session_id, member)
        if newest <= seen:
            continue
        turns = host_port.bound().stored_turns(db_path, member, seen, archived_only=(member == session_id))
        store.index_archived(session_id, member, turns, recall_content, newest)


def recall(args: Any, session_id: str) -> str:
    runtime = _runtime()
    if runtime is None:
        return json.dumps({"error": "the session guard is not active in this process"})
    db_path = runtime.db_for_session(session_id)
    if not db_path.exists():
        return json.dumps({"error": "this conversation has no stored history"})
    store = runtime.store_for(db_path)
    members = lineage(db_path, session_id, store)
    with failing_open(f"indexing archived turns of {session_id} for recall", "snapshots still answer", advice=None,
                      level=logging.WARNING):
        # Compressions leave their snapshots unindexed (indexing is the costly part of a
        # snapshot write); every snapshot of the file enters here, so the index statistics
        # a query ranks by are the same as if each had been indexed when it was written.
        store.index_missing_snapshots(None, recall_text)
        refresh_archived(store, db_path, session_id, members)
    engine = Recall(
        store=store, session_id=session_id, lineage=members, max_chars=runtime.config.recall.max_chars,
        stored_text=lambda row_id: host_port.bound().stored_message(db_path, row_id),
    )
    if not isinstance(args, dict):
        try:
            args = json.loads(args) if isinstance(args, str) else {}
        except ValueError:
            args = {}
    answer = engine.run(args)
    query = str(args.get("query") or "")
    # The query is the user's words (it may quote a secret): the audit log gets its
    # length and a hash (equal queries share it), never the text.
    runtime.audit.operation(session_id).info(
        "recall.answered", query_chars=len(query), query_hash=text_hash(query) if query else None,
        chars=len(answer), turn_start=_turn(args.get("turn_start")), turn_end=_turn(args.get("turn_end")),
    )
    return answer


def _turn(value: Any) -> int | None:
    """A turn number as given, or ``None`` (a non-number is the model's text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def handler(args: Any, **kwargs: Any) -> str:
    """Registry handler. The session id comes from the host, never from ``args``."""
    session_id = _calling_session.get() or kwargs.get("session_id") or None
    if not session_id:
        return json.dumps({"error": "session_guard_recall: the calling conversation is unknown; nothing was read"})
    with failing_open(f"recall for {session_id}", "the tool answers with the error's type", advice=None) as failed:
        return recall(args, str(session_id))
    return json.dumps({"error": f"session_guard_recall failed: {type(failed.exc).__name__}"})


# The plugin context whose recall tool waits for Hermes to write its plugin toolset keys (0.20).
_waiting: list[Any] = []


def register_after_toolset_keys(ctx: Any) -> None:
    """Register the tool once Hermes's background discovery has written the plugin toolset
    keys of this launch (the ``toolset_keys`` seam calls :func:`register_waiting`)."""
    _waiting[:] = [ctx]


def register_waiting() -> None:
    """Register the tool that :func:`register_after_toolset_keys` held back, if any."""
    while _waiting:
        register_recall_tool(_waiting.pop())


def register_recall_tool(ctx: Any) -> None:
    ctx.register_tool(
        name=RECALL_TOOL,
        toolset=TOOLSET,
        schema=SCHEMA,
        handler=handler,
        check_fn=available,
        description=SCHEMA["description"],
        emoji="🧷",
    )


def offered(runtime: Any, agent: Any) -> bool:
    """The host enabled the tool for this agent and its session has compacted history."""
    sid = host_port.bound().session_id(agent)
    return (
        RECALL_TOOL in host_port.bound().tool_names(agent)
        and runtime.config.recall.enabled
        and has_compacted_history(runtime, sid, host_port.bound().db_path(agent))
    )
