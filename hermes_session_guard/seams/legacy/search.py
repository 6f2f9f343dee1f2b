"""Wrappers that keep compacted history where Hermes's own search looks (0.13-0.17; from 0.18
Hermes keeps compacted rows in its own messages table, and its search finds them).

``SessionDB.search_messages`` is the one search every surface uses (the
``session_search`` tool, the dashboard's ``/api/sessions/search``); the wrapper
adds hits from the guard's snapshots (see :mod:`.search_index`) to Hermes's own,
in one ranked list cut at Hermes's ``limit`` / ``offset``. The tool of 0.13-0.14
reads the whole conversation of a hit with ``get_messages_as_conversation``: for
the duration of one tool call, that read puts the session's snapshots before the
live transcript, as the ended parent's rows were before the guard (the ``transcript_load``
rows of 0.13-0.14 name :func:`transcript_load_wrapper`). Export (every release) is
:mod:`..export`'s.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import weakref
from typing import Any

from ...fail_open import failing_open
from ...runtime import Runtime
from ...summaries import snapshot_export
from ..envelope import fails_as, unguarded
from ..row import Wrapper, call_arg
from ..summaries import transcript_load_wrapper as tagging_transcript_load_wrapper
from . import search_index

_signatures: dict[Any, inspect.Signature] = {}
_whole_conversation: contextvars.ContextVar[bool] = contextvars.ContextVar("session_guard_whole_conversation",
                                                                          default=False)


def _bind(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults filled in (only the release's own parameters)."""
    wrapped = unguarded(wrapped)
    key = getattr(wrapped, "__func__", wrapped)
    signature = _signatures.get(key)
    if signature is None:
        signature = _signatures[key] = inspect.signature(wrapped)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def snapshot_hits(runtime: Runtime, db: Any, call: dict[str, Any], want: int) -> tuple[list[dict[str, Any]], str]:
    """Snapshot rows for one ``search_messages`` call, and the sanitized FTS query."""
    query = call.get("query")
    if not isinstance(query, str) or not query.strip():
        return [], ""
    fts_query = type(db)._sanitize_fts5_query(query)
    if not fts_query:
        return [], ""
    store = runtime.store_for(db.db_path)
    like_terms = None
    if type(db)._contains_cjk(fts_query):
        raw = fts_query.strip('"').strip()
        like_terms = [t for t in raw.split() if t.upper() not in {"AND", "OR", "NOT"}] or [raw]
    hits = search_index.search(
        store, fts_query, source_filter=call.get("source_filter"), exclude_sources=call.get("exclude_sources"),
        role_filter=call.get("role_filter"), limit=want, like_terms=like_terms,
    )
    return hits, ("" if like_terms else fts_query)


def merge(host: list[dict[str, Any]], guard: list[dict[str, Any]], ranks: dict[int, float],
          sort: str | None) -> list[dict[str, Any]]:
    """One list in Hermes's order: by ``sort`` (``newest`` / ``oldest``: timestamp)
    or else by FTS5 rank (Hermes's rows by their rank in ``messages_fts``; a row
    whose rank is unknown keeps its place ahead of the snapshot rows)."""
    if sort in ("newest", "oldest"):
        return sorted([*host, *guard], key=lambda r: float(r.get("timestamp") or 0.0), reverse=sort == "newest")
    if not ranks:
        return [*host, *guard]
    keyed = [(ranks.get(r.get("id", -1), float("-inf")), 0, i, r) for i, r in enumerate(host)]
    keyed += [(r.get("_rank", 0.0), 1, i, r) for i, r in enumerate(guard)]
    return [r for *_k, r in sorted(keyed, key=lambda k: (k[0], k[1], k[2]))]


_UNKNOWN = object()
_ANALYSED_CAP = 1024
_analysed: dict[str, tuple[tuple[str, bool], ...] | None] = {}
_stores: weakref.WeakKeyDictionary[Any, tuple[Runtime, Any]] = weakref.WeakKeyDictionary()


def _store_of(runtime: Runtime, db: Any) -> Any:
    """The guard's store for this SessionDB (looked up once per instance)."""
    try:
        held = _stores.get(db)
    except TypeError:
        held = None
    if held is not None and held[0] is runtime:
        return held[1]
    store = runtime.store_for(db.db_path)
    try:
        _stores[db] = (runtime, store)
    except TypeError:
        pass
    return store


def no_snapshot_can_match(runtime: Runtime, db: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when this call's query needs a term no indexed snapshot holds (the query's
    terms are read once per query string, the index's vocabulary once per change)."""
    query = args[0] if args else kwargs.get("query")
    if not isinstance(query, str):
        return False
    terms = _analysed.get(query, _UNKNOWN)
    if terms is _UNKNOWN:
        cls = type(db)
        fts_query = cls._sanitize_fts5_query(query) if query.strip() else ""
        terms = search_index.required_terms(fts_query) if fts_query and not cls._contains_cjk(fts_query) else None
        if len(_analysed) >= _ANALYSED_CAP:
            _analysed.clear()
        _analysed[query] = terms
    if not terms:
        return False
    return search_index.cannot_match(_store_of(runtime, db), terms)  # type: ignore[arg-type]


def search_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.search_messages``: Hermes's hits plus the snapshot rows of this
    state.db that match the same query under the same filters. A query that needs a
    term no snapshot holds goes to Hermes alone, without a second full-text query."""

    @fails_as("this search returns Hermes's own rows only (compacted turns are not searched)", advice="doctor",
              once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # two sub-steps that degrade alone (DEBUG): an unreadable vocabulary searches the snapshots
        # in full, and unranked Hermes hits still merge with the snapshot hits
        hopeless = False  # Hermes's call stays outside the handler: its own error is never swallowed
        with failing_open(row, "the snapshots are searched in full", when="reading the snapshot vocabulary",
                          level=logging.DEBUG, advice=None):
            hopeless = no_snapshot_can_match(runtime, instance, args, kwargs)
        if hopeless:
            return wrapped(*args, **kwargs)
        call = _bind(wrapped, args, kwargs)
        limit, offset = max(_as_int(call["limit"], 20), 0), max(_as_int(call["offset"], 0), 0)
        hits, fts_query = snapshot_hits(runtime, instance, call, limit + offset)
        if not hits:
            return wrapped(*args, **kwargs)
        host = wrapped(**{**call, "limit": limit + offset, "offset": 0})
        with failing_open(row, "snapshot hits follow Hermes's own", when="ranking Hermes's own hits",
                          level=logging.DEBUG, advice=None) as failed:
            ranks = search_index.host_ranks(runtime.store_for(instance.db_path), fts_query,
                                            [r.get("id") for r in host]) if fts_query and host else {}
        if failed:
            ranks = {}
        merged = merge(list(host or []), hits, ranks, call.get("sort"))[offset:offset + limit]
        for hit in merged:
            hit.pop("_rank", None)
        return merged

    return wrapper


def _mark_whole_conversation() -> contextvars.Token[bool]:
    return _whole_conversation.set(True)


def search_tool_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``tools.session_search_tool.session_search``: while it runs, the conversation
    it reads for a hit includes the session's snapshots (:func:`with_snapshots_in_search`)."""

    @fails_as("session_search reads the live transcript of a hit only", advice="doctor", once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _mark_whole_conversation()
        try:
            return wrapped(*args, **kwargs)
        finally:
            _whole_conversation.reset(token)

    return wrapper


def with_snapshots_in_search(runtime: Runtime, row: Any, db: Any, sid: Any, result: Any) -> Any:
    """``SessionDB.get_messages_as_conversation`` inside a ``session_search`` call only
    (0.13-0.14, see :func:`search_tool_wrapper`): the session's snapshot messages, oldest
    snapshot first, then the live transcript ``result``. Everywhere else (resume and the
    rest) ``result`` unchanged. Called by :func:`transcript_load_wrapper`."""
    if not _whole_conversation.get():
        return result
    with failing_open(row, "session_search reads the live transcript only", advice="doctor", once=True):
        store = runtime.store_for(db.db_path)
        found = snapshot_export.snapshots_for_export(store, [str(sid)]).get(str(sid), [])
        if found and isinstance(result, list):
            older = [m for snap in found for m in snap["messages"] if isinstance(m, dict)]
            return [*older, *result]
    return result


def around_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.get_messages_around(session_id, around_message_id, window)`` (0.15-0.17:
    how ``session_search`` opens a hit, directly and through ``get_anchored_view``):
    a snapshot hit's negative id opens the snapshot around it, verbatim, when the
    snapshot belongs to ``session_id``. Hermes's own ids go to Hermes unchanged."""

    @fails_as("a snapshot hit opens to an empty window, as Hermes answers for an unknown id", advice="doctor",
              once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = _bind(wrapped, args, kwargs)
        anchor = call.get("around_message_id")
        if isinstance(anchor, int) and anchor < 0:
            view = search_index.snapshot_window(runtime.store_for(instance.db_path), str(call["session_id"]),
                                                anchor, _as_int(call.get("window"), 5))
            if view is not None:
                return view
        return wrapped(*args, **kwargs)

    return wrapper


def transcript_load_wrapper(runtime: Runtime, row: Any) -> Wrapper:
    """``SessionDB.get_messages_as_conversation`` on 0.13-0.14: the summary tags put back
    (:func:`..summaries.transcript_load_wrapper`), and inside a ``session_search`` call the
    session's snapshots first (:func:`with_snapshots_in_search`)."""
    tagged = tagging_transcript_load_wrapper(runtime, row)

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = tagged(wrapped, instance, args, kwargs)
        return with_snapshots_in_search(runtime, row, instance, call_arg(args, kwargs, 0, "session_id"), result)

    return wrapper
