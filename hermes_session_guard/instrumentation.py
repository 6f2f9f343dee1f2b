"""Apply and remove the seam table's patches: idempotent ``install`` / ``uninstall``."""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any

import wrapt

from .config import GuardConfig
from .host_adapter import unshim_engines
from .hostinfo import installed_version, parse_version
from .runtime import Runtime, SeamStatus
from .seams import SEAMS, SeamRow, seam_names, select_row

log = logging.getLogger("hermes_session_guard")


@dataclass
class _Applied:
    row: SeamRow
    parent: Any
    name: str
    original: Any


_lock = threading.RLock()
_applied: dict[str, _Applied] = {}
_runtime: Runtime | None = None


def current_runtime() -> Runtime | None:
    return _runtime


def _resolve(module_name: str, attribute: str) -> tuple[Any, str, Any]:
    parent: Any = importlib.import_module(module_name)
    path = attribute.split(".")
    for part in path[:-1]:
        parent = getattr(parent, part)
    return parent, path[-1], getattr(parent, path[-1])


def _signature_matches(func: Any, params: tuple[str, ...]) -> bool:
    try:
        names = list(inspect.signature(inspect.unwrap(func)).parameters)
    except (TypeError, ValueError):
        return False
    return names[: len(params)] == list(params)


def _apply(row: SeamRow, runtime: Runtime) -> SeamStatus:
    try:
        parent, name, current = _resolve(row.module, row.attribute)
    except (ImportError, AttributeError) as exc:
        return SeamStatus(row.seam, row.target, "skipped", f"target not found ({exc})", row.failure_policy)
    if not _signature_matches(current, row.params):
        return SeamStatus(
            row.seam, row.target, "skipped",
            f"signature differs from the declared ({', '.join(row.params)}, ...)", row.failure_policy,
        )
    original = parent.__dict__.get(name, current) if isinstance(parent, type) else current
    wrapt.wrap_function_wrapper(parent, name, row.wrapper(runtime, row))
    _applied[row.seam] = _Applied(row, parent, name, original)
    return SeamStatus(row.seam, row.target, "patched", row.note, row.failure_policy)


def install(config: GuardConfig | None = None, *, version: str | None = None) -> Runtime:
    """Patch every seam the installed Hermes supports. Calling it again only
    updates the configuration; seams are never wrapped twice."""
    global _runtime
    with _lock:
        config = config or GuardConfig()
        if _runtime is not None:
            _runtime.config = config
            return _runtime
        host_version = version or installed_version()
        runtime = Runtime(config=config, host_version=host_version)
        parsed = parse_version(host_version) if host_version else None
        supported = any(select_row(seam, parsed) for seam in seam_names())
        for seam in seam_names():
            row = select_row(seam, parsed)
            if row is None and supported:
                # A seam only some releases need (e.g. re-entering a lock older hosts lack).
                ranges = ", ".join(r.range_text for r in SEAMS if r.seam == seam)
                runtime.seams.append(SeamStatus(seam, "-", "skipped", f"not needed on Hermes {host_version} "
                                                f"(used on {ranges})", ""))
                continue
            if row is None:
                supported = ", ".join(r.range_text for r in SEAMS if r.seam == seam)
                reason = (
                    "hermes-agent is not installed"
                    if host_version is None
                    else f"Hermes {host_version} is outside the supported ranges ({supported}); not patched"
                )
                runtime.seams.append(SeamStatus(seam, "-", "skipped", reason, ""))
                log.warning("session guard: seam %s skipped: %s", seam, reason)
                continue
            try:
                status = _apply(row, runtime)
            except Exception as exc:
                status = SeamStatus(row.seam, row.target, "failed", f"{type(exc).__name__}: {exc}",
                                    row.failure_policy)
            if status.state != "patched":
                log.warning("session guard: seam %s %s: %s", status.name, status.state, status.reason)
            runtime.seams.append(status)
        _runtime = runtime
        runtime.audit.logger(session_id=None, op_id=None).info(
            "guard.installed", host_version=host_version,
            seams={s.name: s.state for s in runtime.seams},
        )
        return runtime


def uninstall() -> None:
    """Restore every patched host attribute exactly as it was."""
    global _runtime
    with _lock:
        for seam in list(_applied):
            applied = _applied.pop(seam)
            setattr(applied.parent, applied.name, applied.original)
        unshim_engines()
        if _runtime is not None:
            _runtime.close()
        _runtime = None


def is_installed() -> bool:
    return _runtime is not None
