"""The context-engine ``compress`` shim: a per-instance wrapper on the agent's
active engine that reports failed, empty or runaway summaries to the guard and lets
it tag a successful one before the host persists it."""

from __future__ import annotations

import inspect
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..fail_open import failing_open
from ..safe_text import sendable_messages
from ..summaries.tags import mark_sources, unmark_sources
from . import engines as engine_support

_engine_op = threading.local()
_shimmed_engines: weakref.WeakSet[Any] = weakref.WeakSet()


class EngineVerdict:
    """What the guard learned from the context engine during one compression, and
    what it does to a successful result before the host persists it."""

    def __init__(self, decorate: Callable[[list[Any], list[Any], list[int] | None], None] | None = None,
                 stale: Callable[[], bool] | None = None) -> None:
        self.failure: str | None = None
        self.decorate = decorate
        # native mode: asked once the host holds its compression lease, before the summary call
        self.stale = stale
        self.found_stale = False


# A summary body above this size that is also larger than its input is rejected.
RUNAWAY_SUMMARY_CHARS = 32_000


def _text_size(messages: Any) -> int:
    from ..store import message_text

    return sum(len(message_text(m) or "") for m in messages if isinstance(m, dict))


def _engine_failure(engine: Any, messages: list[Any] | None, out: Any, found: list[int] | None) -> str | None:
    """Why the engine's result ``out`` for ``messages`` (None: not a list) is refused, or None;
    ``found``: the summaries in ``out`` (:func:`summaries.tags.summary_indices`)."""
    if getattr(engine, "_last_compress_aborted", False):
        return str(getattr(engine, "_last_summary_error", None) or "compression aborted")
    err = getattr(engine, "_last_summary_error", None)
    if err:
        return str(err)
    from ..summaries.tags import summary_body_sizes

    if not isinstance(out, list) or found is None:
        return None
    sizes = summary_body_sizes(out, found)
    if sizes and not any(sizes):
        return "the summary model returned an empty summary"
    if messages is not None:
        body = sum(sizes)
        if body > RUNAWAY_SUMMARY_CHARS and body >= _text_size(messages):
            return (f"the summary ({body:,} characters) is larger than the whole conversation it replaces "
                    "(garbage or runaway summary)")
    return None


def _make_engine_shim(cls: Any) -> Any:
    """The ``compress`` shim for engines of class ``cls`` (wraps the class's own ``compress``)."""
    original = cls.compress

    def compress(self: Any, messages: Any, *args: Any, **kwargs: Any) -> Any:
        """The engine's ``compress``, watched by the guard (session guard shim)."""
        verdict: EngineVerdict | None = getattr(_engine_op, "verdict", None)
        if verdict is not None and isinstance(messages, list):
            # Text UTF-8 cannot carry (lone surrogates) would fail the summary request and
            # the host's own write; the engine gets copies with it replaced, the snapshot
            # keeps the originals verbatim (safe_text).
            messages = sendable_messages(messages)
            if verdict.stale is not None and verdict.stale():
                # Another compaction of the session committed after the guard last looked:
                # no second summary of the same turns; the host gets its input back ("no progress").
                verdict.found_stale = True
                return list(messages)
        if verdict is None:
            return original(self, messages, *args, **kwargs)
        # An engine of its own: where each message came from is recorded on it for this call
        # (summaries.tags.SOURCE_KEY), so a shortened copy of a kept message is told from the
        # engine's own summary; the records are gone before the host sees the result.
        own = isinstance(messages, list) and not engine_support.builtin_family(self)
        marked = mark_sources(messages) if own else []
        out: Any = None
        try:
            out = original(self, messages, *args, **kwargs)
            return _watched(self, verdict, messages, out)
        finally:
            if marked:
                unmark_sources(marked, out)

    def _watched(self: Any, verdict: EngineVerdict, messages: Any, out: Any) -> Any:
        from ..summaries.tags import summary_indices

        # kept messages quoting the prefix are not summaries; found once, for the checks and the tags
        given = messages if isinstance(messages, list) else None
        found = summary_indices(out, given) if isinstance(out, list) else None
        failure = _engine_failure(self, given, out, found) or engine_support.empty_summary(self, messages, out)
        if failure:
            # A failed summary must not replace real turns with a fallback marker:
            # hand the host its input back, which every release treats as "no progress".
            verdict.failure = failure
            return list(messages)
        if verdict.decorate is not None and isinstance(out, list) and out is not messages:
            # fail open: the summary stays as the host wrote it
            with failing_open("tagging the compaction summary", "the summary is kept untagged and without its "
                              "recall line", advice=None):
                verdict.decorate(list(messages), out, found if given is not None else None)
        return out

    compress.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    compress.__session_guard_shim__ = True  # type: ignore[attr-defined]
    compress.__name__ = "compress"
    compress.__qualname__ = f"{cls.__qualname__}.compress"
    return compress


def shim_engine(agent: Any) -> None:
    """Give the agent's active context engine (whatever class) a per-instance
    ``compress`` that reports summary failures to the guard. Bound with
    ``MethodType`` so hosts that deep-copy the engine per agent rebind it."""
    engine = getattr(agent, "context_compressor", None)
    if engine is None or getattr(getattr(engine, "__dict__", {}).get("compress"), "__session_guard_shim__", False):
        return
    refused = engine_support.compress_shape(engine)
    if refused:  # an engine of another shape: not wrapped, and said so (selftest lists what does not hold)
        engine_support.refuse_shim(engine, refused)
        return
    engine.compress = types.MethodType(_make_engine_shim(type(engine)), engine)
    _shimmed_engines.add(engine)


def unshim_engines() -> None:
    """Remove the ``compress`` shim from every engine :func:`shim_engine` wrapped."""
    for engine in list(_shimmed_engines):
        vars(engine).pop("compress", None)
    _shimmed_engines.clear()


@contextmanager
def watching_engine(
    agent: Any, decorate: Callable[[list[Any], list[Any], list[int] | None], None] | None = None,
    stale: Callable[[], bool] | None = None,
) -> Iterator[EngineVerdict]:
    shim_engine(agent)
    verdict = EngineVerdict(decorate, stale)
    previous = getattr(_engine_op, "verdict", None)
    _engine_op.verdict = verdict
    try:
        yield verdict
    finally:
        _engine_op.verdict = previous
