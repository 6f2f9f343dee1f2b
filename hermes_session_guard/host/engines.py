"""Which of the guard's promises hold for the active context engine.

The guard never takes Hermes's context-engine slot (only one engine can be
registered, and users of engines such as hermes-lcm keep theirs). It wraps the
compression entry point around whatever engine ``context.engine`` selected, and
it reaches the engine itself in two places only:

* ``engine.compress(messages, ...)``: a per-instance shim (see
  :func:`hermes_session_guard.host.shim_engine`) sees the list the engine
  got and the list it returned. From that difference (the head and the tail the
  engine kept verbatim, matched by position) the guard knows which messages the
  compaction produced, and tags, records and hides them. This needs a plain
  method ``compress`` on the engine's class whose first parameter takes the message
  list (:func:`compress_shape`); an engine without one is not wrapped, and the
  promises that depend on the shim are reported as not holding.
* ``engine.on_session_start(sid, boundary_reason="compression", old_session_id=sid)``
  after a compaction: the same id, so an engine that keeps state per session id
  keeps finding it.

Everything else (id, snapshot, lock, buffering, recall) the guard does around the
host's call, whatever the engine. :func:`assess` turns an engine into the list of
promises with ``holds`` / ``partly`` / ``does not hold`` and a reason;
``selftest`` prints it for the engine the home's config.yaml selects
(:func:`report_for_home`, which loads the engine the way Hermes does in a
subprocess). Nothing here imports Hermes at import time.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..fail_open import failing_open

log = logging.getLogger("hermes_session_guard")

BUILTIN_ENGINE = "compressor"
HOLDS, PARTLY, NOT_HELD = "holds", "partly", "does not hold"
MARKER = "SESSION_GUARD_ENGINE "

#: Every promise of the contract, in the order selftest prints them.
PROMISES: dict[str, str] = {
    "id_stable": "session id unchanged across compression",
    "snapshot": "pre-compression history kept verbatim as a snapshot",
    "one_compression": "one compression per session",
    "buffering": "messages arriving mid-compression buffered and delivered in order",
    "engine_state": "engine's per-session state kept (boundary callback names the same id)",
    "summaries_tagged": "summaries tagged is_compressed_summary and hidden",
    "summary_failure": "a failed or empty summary is refused (conversation kept)",
    "recall_line": "recall line ([Original context: ...]) inside the summary",
    "recall": "recall over the snapshot (session_guard_recall)",
}


@dataclass(frozen=True)
class Promise:
    key: str
    text: str
    state: str
    detail: str = ""


@dataclass
class EngineSupport:
    name: str
    engine_class: str
    kind: str  # "built-in" | "built-in subclass" | "own"
    wrappable: bool
    reason: str = ""
    promises: list[Promise] = field(default_factory=list)

    @property
    def all_hold(self) -> bool:
        return all(p.state == HOLDS for p in self.promises)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "all_hold": self.all_hold}


def _builtin_class() -> type | None:
    with failing_open("importing agent.context_compressor", "no engine is taken for Hermes's own compressor",
                      level=logging.DEBUG, advice=None):
        from agent.context_compressor import ContextCompressor

        compressor: type = ContextCompressor
        return compressor
    return None


def builtin_family(engine: Any) -> bool:
    """Hermes's own compressor or a subclass of it: its summaries carry Hermes's
    summary prefix, and the host's failure attributes (``_last_summary_error``)."""
    cls = _builtin_class()
    return cls is not None and isinstance(engine, cls)


def engine_kind(engine: Any) -> str:
    cls = _builtin_class()
    if cls is not None and type(engine) is cls:
        return "built-in"
    return "built-in subclass" if builtin_family(engine) else "own"


def compress_shape(engine: Any) -> str | None:
    """``None`` when the guard can wrap ``engine.compress``; otherwise why not.

    Wrappable: a plain (not async) function ``compress`` on the engine's class whose
    first parameter after ``self`` takes the message list positionally, as every
    release's ``ContextEngine.compress(messages, current_tokens=None, ...)`` defines."""
    fn = getattr(type(engine), "compress", None)
    if fn is None or not callable(fn):
        return "the engine's class has no compress method"
    if not inspect.isfunction(fn):
        return f"compress is a {type(fn).__name__}, not a plain method"
    refused = _function_shape(fn)
    if refused is not None:
        return refused
    own = vars(engine).get("compress") if hasattr(engine, "__dict__") else None
    if own is not None and not getattr(own, "__session_guard_shim__", False):
        return "compress is replaced on the engine instance by something else"
    return None


@functools.lru_cache(maxsize=64)
def _function_shape(fn: Any) -> str | None:
    """:func:`compress_shape`'s verdict on the function itself, read once per function (its
    signature costs about 0.1 ms; a compaction asks twice). A class whose ``compress`` is
    replaced gives a new function, read anew."""
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
        return "compress is async or a generator; Hermes calls it synchronously"
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError) as exc:
        return f"compress has no readable signature ({exc})"
    if not params:
        return "compress takes no message list"
    first = params[0]
    if first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD, first.VAR_POSITIONAL):
        return f"compress's first parameter {first.name!r} is keyword-only; Hermes passes the messages positionally"
    return None


def produced_positions(before: list[Any], after: list[Any]) -> list[int]:
    """Positions in ``after`` (an engine's output for ``before``) of the summary the
    compaction produced, decided from identity and position, never from what a text says.

    A message of ``after`` is one the engine kept when it is the very object it was
    given (kept as is, or edited in place), or equal to the message at the same place
    counted from either end. What is left (user/assistant turns; tool results and
    tool-call turns are the engine's bookkeeping) is the summary only when it is one
    message, a kept message follows it, and the engine dropped more of its input than it
    added: anything else (a summary in several parts, or kept messages the engine copied
    and shortened) cannot be told apart from a rewritten kept turn, and nothing is
    returned. Hiding a person's turn is worse than showing a summary.

    When the shim recorded where each input message came from
    (:func:`summaries.tags.produced_by_source`), copies the engine made of kept messages
    are known by that record and its own message is the one without it."""
    from ..store import message_text
    from ..summaries.tags import produced_by_source

    by_source = produced_by_source(before, after)
    if by_source is not None:
        return by_source

    def same(a: Any, b: Any) -> bool:
        return (isinstance(a, dict) and isinstance(b, dict) and a.get("role") == b.get("role")
                and message_text(a) == message_text(b))

    n, m = len(before), len(after)
    if m >= n:
        return []
    given = {id(msg): j for j, msg in enumerate(before)}
    source: list[int | None] = [given.get(id(msg)) for msg in after]
    head = 0
    while head < min(n, m) and same(before[head], after[head]):
        source[head] = head if source[head] is None else source[head]
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and same(before[n - 1 - tail], after[m - 1 - tail]):
        if source[m - 1 - tail] is None:
            source[m - 1 - tail] = n - 1 - tail
        tail += 1
    new = [i for i in range(m) if source[i] is None]
    made = [i for i in new if isinstance(after[i], dict) and after[i].get("role") in ("user", "assistant")
            and not after[i].get("tool_calls")]
    dropped = n - len({j for j in source if j is not None})
    if len(made) != 1 or dropped <= len(new) or not any(source[i] is not None for i in range(made[0] + 1, m)):
        return []
    return made


def empty_summary(engine: Any, before: list[Any], after: list[Any]) -> str | None:
    """For an engine outside Hermes's compressor family: the reason to refuse its
    result when every message it produced is empty (it dropped turns and said nothing)."""
    from ..store import message_text

    if builtin_family(engine) or not isinstance(after, list) or len(after) >= len(before):
        return None
    made = produced_positions(before, after)
    if made and all(not (message_text(after[i]) or "").strip() for i in made):
        return f"the context engine {engine_name(engine)!r} returned an empty summary"
    return None


def engine_name(engine: Any) -> str:
    with failing_open("reading a context engine's name", "its class name stands in", level=logging.DEBUG,
                      advice=None):
        return str(engine.name)
    return type(engine).__name__


_warned: set[tuple[str, str]] = set()


def refuse_shim(engine: Any, reason: str) -> None:
    """Say once per engine class which promises do not hold because its compress
    cannot be wrapped."""
    key = (type(engine).__qualname__, reason)
    if key in _warned:
        return
    _warned.add(key)
    lost = ", ".join(PROMISES[k] for k in ("summaries_tagged", "summary_failure", "recall_line"))
    log.warning(
        "session guard: context engine %r (%s): %s; its compress is not wrapped. Still held: id, snapshot, one "
        "compression per session, buffering, engine state, recall. NOT held: %s. Run `hermes-session-guard "
        "selftest`.", engine_name(engine), type(engine).__qualname__, reason, lost,
    )


def assess(engine: Any, *, name: str | None = None, handoff: bool = False) -> EngineSupport:
    """The promises for ``engine`` (``None``: Hermes's built-in compressor). ``handoff``:
    the home enables ``session_guard.handoff`` (an explicit move to a new session id)."""
    if engine is None:
        support = EngineSupport(name or BUILTIN_ENGINE, "ContextCompressor", "built-in", True)
    else:
        reason = compress_shape(engine)
        support = EngineSupport(name or engine_name(engine), type(engine).__qualname__, engine_kind(engine),
                                reason is None, reason or "")
    states: dict[str, tuple[str, str]] = {k: (HOLDS, "") for k in PROMISES}
    states["engine_state"] = (HOLDS, "the guard announces the boundary with the same session id")
    if support.kind == "own":
        states["summaries_tagged"] = (HOLDS, "recognised by identity and position: the one new message between "
                                             "the messages the engine kept; when that is unclear, nothing is tagged")
        states["summary_failure"] = (PARTLY, "an engine exception or an empty summary is refused; a wrong but "
                                             "non-empty summary cannot be told apart")
        states["recall_line"] = (NOT_HELD, "the engine writes its own summary format without Hermes's summary "
                                           "prefix; the system prompt's recall rule tells the model instead")
    if handoff and support.kind != "built-in":
        states["engine_state"] = (PARTLY, "held across compressions; session_guard.handoff is enabled, and a hand-off "
                                          "moves the conversation to a new id: the engine gets on_session_start(new, "
                                          "boundary_reason='handoff', old_session_id=old) and must carry its state "
                                          "over itself")
    if not support.wrappable:
        for key in ("summaries_tagged", "summary_failure", "recall_line"):
            states[key] = (NOT_HELD, f"compress not wrapped: {support.reason}")
    support.promises = [Promise(k, PROMISES[k], *states[k]) for k in PROMISES]
    return support


# -- the engine a home selects --------------------------------------------------------


def _config_entry(home: Path, section: str, key: str) -> Any:
    """``section.key`` of ``home``/config.yaml (None when absent)."""
    from ..config import read_config_file

    data = read_config_file(Path(home) / "config.yaml")
    found = data.get(section) if isinstance(data, dict) else None
    return found.get(key) if isinstance(found, dict) else None


def configured_engine(home: Path) -> str:
    """``context.engine`` of ``home``/config.yaml (``compressor`` when unset)."""
    return str(_config_entry(home, "context", "engine") or BUILTIN_ENGINE)


def handoff_enabled(home: Path) -> bool:
    """``session_guard.handoff.enabled`` in ``home``/config.yaml (off by default)."""
    handoff = _config_entry(home, "session_guard", "handoff")
    return isinstance(handoff, dict) and handoff.get("enabled") is True


def load_engine(name: str) -> tuple[Any, str]:
    """The engine Hermes would select for ``name`` in this process's HERMES_HOME, the
    way ``AIAgent`` does (a repo-shipped ``plugins/context_engine/<name>``, then a
    plugin's ``register_context_engine``), or ``(None, why)``. Runs plugin discovery."""
    with failing_open(f"plugins.context_engine loading {name}", "the plugins' registered engine is looked up",
                      level=logging.DEBUG, advice=None):
        from plugins.context_engine import load_context_engine

        engine = load_context_engine(name)
        if engine is not None:
            return engine, "plugins/context_engine"
    from hermes_cli.plugins import discover_plugins, get_plugin_context_engine

    discover_plugins()
    engine = get_plugin_context_engine()
    if engine is None:
        return None, "no plugin registered a context engine (is the plugin listed in plugins.enabled?)"
    if engine_name(engine) != name:
        return None, f"the registered context engine is {engine_name(engine)!r}, not {name!r}"
    return engine, "plugin"


def inspect_home(home: Path) -> dict[str, Any]:
    """In a process whose HERMES_HOME is ``home``: the configured engine and its promises."""
    name = configured_engine(home)
    if name == BUILTIN_ENGINE:
        return {"configured": name, "found": True, **assess(None).as_dict()}
    engine, source = load_engine(name)
    handoff = handoff_enabled(home)
    if engine is None:
        support = assess(None, name=BUILTIN_ENGINE).as_dict()
        return {"configured": name, "found": False,
                "detail": f"{source}; Hermes falls back to its built-in compressor", **support}
    return {"configured": name, "found": True, "source": source,
            **assess(engine, name=name, handoff=handoff).as_dict()}


def report_for_home(home: Path, timeout: float = 60.0) -> dict[str, Any]:
    """:func:`inspect_home` in a subprocess (plugin discovery imports the home's plugins)."""
    name = configured_engine(home)
    if name == BUILTIN_ENGINE:
        return {"configured": name, "found": True, **assess(None).as_dict()}
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("HERMES_SESSION_ID", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "hermes_session_guard.host.engines", str(home)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"configured": name, "found": False, "error": f"loading the engine timed out after {timeout:.0f}s"}
    for line in proc.stdout.splitlines():
        if MARKER in line:
            found: dict[str, Any] = json.loads(line.split(MARKER, 1)[1])
            return found
    return {"configured": name, "found": False, "error": "could not load the engine: " + proc.stderr[-2000:]}


def print_report(report: dict[str, Any], emit: Callable[[str], None] = print) -> None:
    name = report.get("configured") or BUILTIN_ENGINE
    if report.get("builtin"):
        emit(f"Context engine {name!r} (Hermes's built-in): the live probe above checks the contract with it")
        return
    if report.get("error"):
        emit(f"Context engine {name!r}: UNKNOWN ({report['error']}); the promises below cannot be confirmed")
        return
    where = f" (class {report.get('engine_class')}, {report.get('kind')})" if report.get("found") else ""
    emit(f"Context engine {name!r}{where}:" + ("" if report.get("found") else f" NOT FOUND - {report.get('detail')}"))
    if name != BUILTIN_ENGINE:
        emit("  (the live probe above runs Hermes's built-in compressor; below, what holds with this engine, "
             "from its shape)")
    if report.get("reason"):
        emit(f"  compress not wrapped: {report['reason']}")
    for p in report.get("promises", []):
        detail = f"  ({p['detail']})" if p.get("detail") and p["state"] != HOLDS else ""
        emit(f"  [{p['state'].upper()}] {p['text']}{detail}")
    if not report.get("all_hold", True):
        emit("  Not every promise holds with this engine (see above).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hermes_session_guard.host.engines")
    parser.add_argument("home")
    args = parser.parse_args(argv)
    with failing_open("inspecting the home's context engine", "the output says why", level=None) as failed:
        out = inspect_home(Path(args.home))
    if failed:
        out = {"configured": "?", "found": False, "error": failed.reason}
    print(MARKER + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
