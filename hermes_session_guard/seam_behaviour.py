"""Typed values of the seam table: a row's version-specific behaviour, its failure
policy and kind, and the state a seam ends up in.

Every enum is a ``StrEnum`` whose values are the words the table, the logs, the
audit events and ``selftest --json`` have always used, so a value compares equal
to its word and prints as it (``Strategy.DETACH_DB == "detach_db"``).

:class:`Behaviour` is a frozen dataclass with one optional field per behaviour key
(``None``: the row does not say), read by attribute (``row.behaviour.strategy``); a
word becomes the field's type when the table is built, and an unknown key or value is
refused then.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any


class Strategy(StrEnum):
    """How the host is kept from rotating the session id during a compression."""

    DETACH_DB = "detach_db"  # 0.13-0.17: run the host's compression with its SessionDB detached
    HOST_IN_PLACE = "host_in_place"  # 0.18-0.19: the host's own in-place compaction, under the guard's hold
    # 0.20+: Hermes compacts in place under its own holder-checked lock; the guard neither
    # locks nor replaces anything, it tags, references the archived rows and records
    HOST_NATIVE = "host_native"


class FlushCursor(StrEnum):
    """How the host remembers which messages already reached state.db."""

    INDEX = "index"
    IDENTITY = "identity"
    MARKER = "marker"


class TranscriptOrder(StrEnum):
    """How ``SessionDB.get_messages_as_conversation`` orders a transcript."""

    ID = "id"
    TIMESTAMP = "timestamp"


class SnapshotStorage(StrEnum):
    """How a compression's snapshot keeps the replaced transcript: a copy where Hermes keeps
    no rows (0.13-0.17) or deletes them right after compacting (0.18.x), a reference to
    Hermes's archived rows from 0.19 (native mode, 0.20+, always references)."""

    COPY = "copy"  # the guard's own copy (session_guard_snapshot_messages)
    REFERENCE = "reference"  # Hermes's archived rows, named by id, when they hold the transcript exactly


class LockMode(StrEnum):
    """Which cross-process lease serialises compressions of one session."""

    GUARD = "guard"  # the guard's session_guard_locks
    NATIVE = "native"  # Hermes's compression_locks, held by the guard
    HOST = "host"  # Hermes's compression_locks, taken and checked by Hermes alone (native mode)


class FailurePolicy(StrEnum):
    """What a guard error inside a seam (or a failing lease table) leads to."""

    OPEN = "open"  # the host runs as without the guard
    CLOSED = "closed"  # the guarded action is refused
    NONE = ""  # a row that wraps nothing


class GatewayTranscript(StrEnum):
    """What the guard re-bases in the gateway's transcript bookkeeping after a compaction."""

    JSONL_AND_OFFSET = "jsonl_and_offset"
    OFFSET = "offset"
    HOST = "host"


class SessionFrom(StrEnum):
    """Where an API server request names its session."""

    PATH = "path"
    HEADER = "header"
    BODY = "body"  # /v1/responses, /v1/runs: a ``session_id`` or a stored ``previous_response_id``


class SeamKind(StrEnum):
    """How a row reaches the host."""

    WRAP = "wrap"  # the class or module attribute is wrapped (instrumentation applies it)
    INSTANCE_SHIM = "instance shim"  # host objects get a per-instance attribute from the named function


class Effect(StrEnum):
    """What patching a row does to Hermes: on a release newer than the table only
    ``observe`` rows may be patched on a signature match alone."""

    CHANGES = "changes"  # compression, locks, turn order, buffering, delivery, requests: changes behaviour
    OBSERVE = "observe"  # read-only and display: what a person sees or a read returns, never what is stored


class SeamState(StrEnum):
    """Where a seam stands in this process."""

    PATCHED = "patched"
    PENDING = "pending"
    NOT_NEEDED = "not-needed"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Behaviour:
    """A seam row's version-specific behaviour (the keys are documented in seams.py)."""

    strategy: Strategy | None = None
    flush_cursor: FlushCursor | None = None
    transcript_order: TranscriptOrder | None = None
    lock: LockMode | None = None
    lock_failure: FailurePolicy | None = None
    native_summary_key: str | None = None  # "" or "_compressed_summary"
    transcript: GatewayTranscript | None = None
    lease_table: str | None = None
    session_from: SessionFrom | None = None
    snapshot: SnapshotStorage | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = field_type(f.name)
            if value is not None and not isinstance(value, kind):
                object.__setattr__(self, f.name, kind(value))  # ValueError for a value the guard does not know

    @classmethod
    def of(cls, values: Behaviour | Mapping[str, Any] | None) -> Behaviour:
        """From ``{key: value}`` (a table entry); an unknown key is a ``TypeError``."""
        if isinstance(values, Behaviour):
            return values
        return cls(**dict(values or {}))

    def merged(self, changes: Mapping[str, Any]) -> Behaviour:
        """This behaviour with the keys of ``changes`` set over it (a range of the table)."""
        return replace(self, **changes)

    def set_values(self) -> dict[str, Any]:
        """The keys this behaviour sets (not ``None``) and their values."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    def __repr__(self) -> str:  # what a row sets, not ten fields of None
        return f"Behaviour({self.set_values()!r})"


@functools.cache
def field_type(name: str) -> type:
    """The type a :class:`Behaviour` field holds, from its annotation (``X | None``)."""
    hint = typing.get_type_hints(Behaviour)[name]
    found: type = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return found


NO_BEHAVIOUR = Behaviour()
