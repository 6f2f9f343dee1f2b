"""What the installed Hermes can do, read off its code, and the seam rows that follow from it.

On a release the seam table covers, the table's row is the contract (it was tested there). On
a release outside it, which row a behaviour seam gets is derived here from what Hermes has, not
from its version number: whether ``SessionDB.archive_and_compact`` exists (in-place compaction)
and takes ``lock_holder`` (a holder-checked commit), whether ``SessionDB`` has durable turn
leases and a native compression lock, how a transcript is ordered
and which marks the agent keeps on flushed messages. :func:`derive` turns those facts into the
behaviour keys a seam's row must carry; :func:`choose_rows` lists the table rows that carry them,
best first. What a chosen row then does on that install is verified by ``selftest``
(:mod:`.verification`) before any process patches it.

The rules (each checked against the table's row on every release CI installs,
``tests/integration/test_capabilities_match_table.py``):

* strategy: ``host_native`` where the in-place commit checks its lock holder and turns take a
  durable lease (Hermes guards its own compaction); ``host_in_place`` where Hermes compacts in
  place under a native lock; ``detach_db`` otherwise (every rotation step needs the SessionDB).
* lock: Hermes's own (``host``) in native mode, Hermes's table held by the guard (``native``)
  where it exists, the guard's own (``guard``) otherwise.
* snapshot: a reference to Hermes's archived rows in native mode, and in place where Hermes
  reads a resume's live and archived rows apart (``get_resume_conversations``: 0.18.x has
  neither that nor archived rows that stay put); a copy otherwise.
* flush cursor: the ``_db_persisted`` marker where Hermes compacts in place; the id set where
  the agent names ``_flushed_db_message_ids``; the index otherwise.
* transcript order: by timestamp where ``get_messages_as_conversation`` orders so.
* native summary key: ``_compressed_summary`` in place and with the id-set cursor (both came
  with it), none before.
* gateway transcript: Hermes re-baselines itself in place; a JSONL copy where
  ``SessionStore.get_transcript_path`` exists; the offset otherwise.
* API server turns: in front of Hermes's durable turn leases where it has them (or Hermes's
  own order alone), in the guard's process-local order otherwise.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import types
from dataclasses import dataclass
from typing import Any

from ..fail_open import failing_open
from ..locks.turn_lock import HOST_TURN_LEASES
from ..seam_behaviour import (
    FlushCursor,
    GatewayTranscript,
    LockMode,
    SnapshotStorage,
    Strategy,
    TranscriptOrder,
)
from .row import SeamRow

NATIVE_SUMMARY_KEY = "_compressed_summary"


@dataclass(frozen=True)
class Capabilities:
    """Facts about the installed Hermes that decide how a seam is applied."""

    in_place: bool = False  # SessionDB.archive_and_compact
    holder_checked_commit: bool = False  # archive_and_compact(..., lock_holder=...)
    turn_leases: bool = False  # SessionDB.acquire_session_turn_lease
    native_lock: bool = False  # SessionDB.try_acquire_compression_lock
    resume_reads_archive_apart: bool = False  # SessionDB.get_resume_conversations
    identity_flush_ids: bool = False  # run_agent names _flushed_db_message_ids
    timestamp_order: bool = False  # get_messages_as_conversation orders by timestamp
    jsonl_transcript: bool = False  # gateway.session:SessionStore.get_transcript_path

    def describe(self) -> str:
        return ", ".join(name for name, value in vars(self).items() if value) or "none"


def _attribute(module: str, path: str) -> Any:
    """``module.path`` on the installed Hermes, ``None`` when it is not there."""
    with failing_open(f"reading {module}:{path}", "treated as absent", level=logging.DEBUG, advice=None) as failed:
        found: Any = importlib.import_module(module)
        for part in path.split("."):
            found = getattr(found, part, None)
            if found is None:
                break
    return None if failed else found


def _code_names(obj: Any) -> set[str]:
    """Every name and string constant the code of ``obj`` (a function, or a class's
    functions) mentions, nested functions included."""
    out: set[str] = set()

    def walk(code: types.CodeType) -> None:
        out.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, str):
                out.add(const)
            elif isinstance(const, types.CodeType):
                walk(const)

    members = vars(obj).values() if isinstance(obj, type) else [obj]
    for member in members:
        func = inspect.unwrap(getattr(member, "__func__", member))
        code = getattr(func, "__code__", None)
        if isinstance(code, types.CodeType):
            walk(code)
    return out


def _params(func: Any) -> list[str]:
    try:
        return list(inspect.signature(inspect.unwrap(func)).parameters)
    except (TypeError, ValueError):
        return []


def detect() -> Capabilities:
    """Read the capabilities off the installed Hermes (imports ``hermes_state``, ``run_agent``
    and ``agent.conversation_compression`` where they exist: a process about to patch them
    imports them anyway)."""
    db = _attribute("hermes_state", "SessionDB")
    archive = getattr(db, "archive_and_compact", None) if db is not None else None
    conversation = getattr(db, "get_messages_as_conversation", None) if db is not None else None
    agent = _attribute("run_agent", "AIAgent")
    order_sql = [name for name in _code_names(conversation) if "ORDER BY" in name.upper()] if conversation else []
    return Capabilities(
        in_place=archive is not None,
        holder_checked_commit=archive is not None and "lock_holder" in _params(archive),
        turn_leases=db is not None and hasattr(db, "acquire_session_turn_lease"),
        native_lock=db is not None and hasattr(db, "try_acquire_compression_lock"),
        resume_reads_archive_apart=db is not None and hasattr(db, "get_resume_conversations"),
        identity_flush_ids=agent is not None and "_flushed_db_message_ids" in _code_names(agent),
        timestamp_order=any("TIMESTAMP" in sql.upper().split("ORDER BY", 1)[1][:40] for sql in order_sql),
        jsonl_transcript=_attribute("gateway.session", "SessionStore.get_transcript_path") is not None,
    )


def compression_behaviour(caps: Capabilities) -> dict[str, Any]:
    """The compression row's behaviour keys for a Hermes with ``caps``."""
    if caps.in_place and caps.holder_checked_commit and caps.turn_leases:
        strategy = Strategy.HOST_NATIVE
    elif caps.in_place and caps.native_lock:
        strategy = Strategy.HOST_IN_PLACE
    else:
        strategy = Strategy.DETACH_DB
    if strategy is Strategy.HOST_NATIVE:
        lock = LockMode.HOST
    else:
        lock = LockMode.NATIVE if caps.native_lock else LockMode.GUARD
    reference = strategy is Strategy.HOST_NATIVE or (caps.in_place and caps.resume_reads_archive_apart)
    if caps.in_place:
        flush = FlushCursor.MARKER
    else:
        flush = FlushCursor.IDENTITY if caps.identity_flush_ids else FlushCursor.INDEX
    return {
        "strategy": strategy,
        "lock": lock,
        "snapshot": SnapshotStorage.REFERENCE if reference else SnapshotStorage.COPY,
        "flush_cursor": flush,
        "transcript_order": TranscriptOrder.TIMESTAMP if caps.timestamp_order else TranscriptOrder.ID,
        "native_summary_key": summary_key(caps),
        "lock_failure": "closed",
    }


def summary_key(caps: Capabilities) -> str:
    return NATIVE_SUMMARY_KEY if caps.in_place or caps.identity_flush_ids else ""


def derive(seam: str, caps: Capabilities) -> dict[str, Any]:
    """The behaviour keys a row of ``seam`` must carry on a Hermes with ``caps`` ({} when the
    seam's rows carry no capability-dependent behaviour)."""
    if seam == "compression":
        return compression_behaviour(caps)
    if seam == "gateway_turn":
        transcript = GatewayTranscript.HOST if caps.in_place else \
            GatewayTranscript.JSONL_AND_OFFSET if caps.jsonl_transcript else GatewayTranscript.OFFSET
        return {"transcript": transcript}
    if seam == "transcript_load":
        return {"native_summary_key": summary_key(caps)}
    return {}


def matches(row: SeamRow, wanted: dict[str, Any]) -> bool:
    values = row.behaviour.set_values()
    return all(values.get(key) == value for key, value in wanted.items())


def choose_rows(seam: str, rows: list[SeamRow], caps: Capabilities) -> list[SeamRow]:
    """The rows of ``seam`` (``rows``: newest first) whose behaviour is what ``caps`` call for,
    in that order; the caller applies the first whose target and ``requires`` verify. Among
    rows of equal behaviour the newer comes first (a later row follows a target that moved)."""
    wanted = derive(seam, caps)
    if seam.startswith("api_") and seam.endswith("_turns"):
        # with Hermes's durable turn leases a request waits in front of them, or Hermes orders it alone
        if caps.turn_leases:
            return [row for row in rows if row.behaviour.lease_table == HOST_TURN_LEASES or not row.patches]
        return [row for row in rows if row.behaviour.lease_table is None]
    return [row for row in rows if matches(row, wanted)]
