"""Audit trail: structlog events written as JSON lines and bridged to stdlib logging.

Every event is one JSON object per line in ``$HERMES_HOME/logs/session_guard.jsonl``
with at least ``event``, ``session_id``, ``op_id`` and ``ts``. The same event is
forwarded to the stdlib logger ``hermes_session_guard`` so it lands in Hermes's
own log files (agent.log / gateway.log) next to the host's lines.

Loggers are bound explicitly per operation (``audit.operation(session_id)``),
not through contextvars or thread-locals, so the session id an operation names
cannot drift when the work hops to an executor thread.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .fail_open import failing_open
from .files import append_bytes
from .redaction_core import mask_secrets


def _import_structlog() -> Any:
    """structlog's console renderer and traceback formatter import ``rich`` (and
    pygments) when it is installed. The guard only hands event dicts to its own
    sink, so where the host has not loaded rich itself it stays unloaded: about
    5 MB of memory and 30 ms of start-up per process (Hermes 0.14's gateway, for
    one). Hermes does not use structlog; ``rich`` imports normally afterwards."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return importlib.import_module("structlog")
    sys.modules["rich"] = None  # type: ignore[assignment]  # makes `import rich` fail for structlog's probe
    try:
        return importlib.import_module("structlog")
    finally:
        if sys.modules.get("rich", 0) is None:
            del sys.modules["rich"]


structlog = _import_structlog()

stdlib_logger = logging.getLogger("hermes_session_guard")

_WARNING_EVENTS = ("failed", "refused", "overflow", "disabled", "error")


class _AppendFile:
    """The file structlog's ``WriteLogger`` writes the rendered lines to: each line is
    appended on its own (the file opened, written and closed), so several processes
    sharing a ``HERMES_HOME`` interleave whole lines, and a path that follows the
    home's configuration is read at every line. Written through
    :func:`~hermes_session_guard.files.append_bytes`: no link followed under the home,
    created ``0600`` (a ``logs/`` directory the guard creates ``0700``) and owned by the
    home's owner when root writes it. A full disk must not take the host down: a failed
    write is said once per outage on the stdlib logger (where the event itself went
    already), then counted."""

    def __init__(self, path: Path | Callable[[], Path], home: Path | Callable[[], Path] | None = None) -> None:
        self._path = path
        self._home = home
        self._lost = 0  # lines not written since the last write that worked

    def write(self, line: str) -> None:  # WriteLogger serialises the calls under its own lock
        path = self._path() if callable(self._path) else self._path
        home = self._home() if callable(self._home) else self._home
        try:
            append_bytes(path, line.encode("utf-8"), home=home, private=True)
        except OSError as exc:
            if not self._lost:
                stdlib_logger.warning(
                    "session guard audit write failed (%s): %s; further audit events are only logged here "
                    "until it can be written again", path, exc,
                )
            self._lost += 1
        else:
            if self._lost:
                stdlib_logger.warning("session guard audit log %s is writable again; %d event(s) were not "
                                      "written to it", path, self._lost)
                self._lost = 0

    def flush(self) -> None:
        return None


def audit_file(home: Path, configured: str) -> Path:
    """The audit log ``audit.path`` names: relative to the home, or an absolute path
    (documented; ``doctor`` reports it, as it lies outside the home's protections)."""
    path = Path(configured)
    return path if path.is_absolute() else Path(home) / path


def _scrub_values(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return scrubbed(event_dict)


def _to_stdlib(_: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Bridge: the same event, as one line of the stdlib logger ``hermes_session_guard``
    (Hermes's own log files); a warning when its name says something went wrong."""
    event = str(event_dict.get("event", ""))
    level = {"warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}.get(
        method_name, logging.INFO)
    if level == logging.INFO and any(word in event for word in _WARNING_EVENTS):
        level = logging.WARNING
    if stdlib_logger.isEnabledFor(level):
        extras = " ".join(f"{k}={v}" for k, v in event_dict.items() if k not in ("event", "ts") and v is not None)
        stdlib_logger.log(level, "session guard %s: %s", event, extras)
    return event_dict


# Short values the secret rules found nothing in (ids, versions, strategies, reasons recur on
# every line of an operation): not scanned again. Only clean values are kept, a bounded number.
_CLEAN_MAX_CHARS, _CLEAN_MAX_VALUES = 256, 1024
_clean_values: set[str] = set()
_ID_KEYS = ("_id", "_id_after", "holder")  # session_id, op_id, ..., session_id_after, lock_holder, ...


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        if value in _clean_values:
            return value
        out = mask_secrets(value)
        if out == value and len(value) <= _CLEAN_MAX_CHARS:
            if len(_clean_values) >= _CLEAN_MAX_VALUES:
                _clean_values.clear()
            _clean_values.add(value)
        return out
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def scrubbed(event_dict: dict[str, Any]) -> dict[str, Any]:
    """Events carry ids, counts, lengths, hashes and reasons, never user text; as a
    last net every other string value (an exception message quoting a value, a path)
    goes through the guard's secret rules before it is written or logged. An id (a key
    ending in ``_id``, ``_id_after`` or ``holder``: session, op, snapshot and lock holder ids, made by
    Hermes or the guard) is written as it is: new ones come with every operation, and
    scanning each costs more than the rest of the line."""
    with failing_open("the audit secret net", "the event is kept as it came", advice=None,
                      level=logging.DEBUG):  # never lose the event over the net
        return {k: v if k in ("event", "ts") or (k.endswith(_ID_KEYS) and isinstance(v, str)) else _scrub(v)
                for k, v in event_dict.items()}
    return event_dict


class AuditLog:
    """Factory for per-operation bound loggers: structlog's processors (a timestamp, the
    secret net, the stdlib bridge, its JSON renderer) in front of its ``WriteLogger``
    writing one line per event to the audit file (``path``, in ``home`` when given:
    no link below the home followed, new files the home owner's)."""

    @classmethod
    def for_home(cls, home: Path, configured: str) -> AuditLog:
        """The audit log of ``home`` as ``audit.path`` configures it (:func:`audit_file`)."""
        return cls(audit_file(home, configured), home=Path(home))

    def __init__(self, path: Path | Callable[[], Path], home: Path | Callable[[], Path] | None = None) -> None:
        self._factory = structlog.WriteLoggerFactory(file=_AppendFile(path, home))

    def logger(self, **bound: Any) -> Any:
        return structlog.wrap_logger(
            self._factory(),
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                _scrub_values,
                _to_stdlib,
                structlog.processors.JSONRenderer(default=str, ensure_ascii=False),
            ],
            wrapper_class=structlog.BoundLogger,
            cache_logger_on_first_use=False,
        ).bind(**bound)

    def operation(self, session_id: str, op_id: str | None = None, **extra: Any) -> Any:
        """A logger pinned to one session id and one operation id."""
        return self.logger(session_id=session_id, op_id=op_id or new_op_id(), **extra)


def new_op_id() -> str:
    return uuid.uuid4().hex[:12]


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every audit event in ``path`` (malformed lines are skipped)."""
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
