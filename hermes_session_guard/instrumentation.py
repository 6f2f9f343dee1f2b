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
from .seams import (
    TESTED_RELEASES,
    SeamRow,
    fallback_rows,
    host_in_table,
    oldest_supported,
    seam_names,
    select_row,
    version_text,
)

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
_reported: set[str] = set()


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


def verify_row(row: SeamRow) -> str | None:
    """``None`` when the installed host has the row's target with the declared
    leading parameters and every name the row requires; else why not."""
    try:
        _, _, current = _resolve(row.module, row.attribute)
    except (ImportError, AttributeError) as exc:
        return f"target {row.target} not found ({exc})"
    if not _signature_matches(current, row.params):
        return f"{row.target} signature differs from the declared ({', '.join(row.params)}, ...)"
    for name in row.requires:
        module_name, _, attribute = name.partition(":")
        try:
            _resolve(module_name, attribute)
        except (ImportError, AttributeError):
            return f"required host name {name} not found"
    return None


def _apply(row: SeamRow, runtime: Runtime, reason: str) -> SeamStatus:
    problem = verify_row(row)
    if problem is not None:
        return SeamStatus(row.seam, row.target, "skipped", problem, row.failure_policy, row.range_text)
    runtime.behaviour[row.seam] = dict(row.behaviour)
    if row.wrapper is None:
        # The host already does what this seam would add; the row's note says how.
        return SeamStatus(row.seam, row.target, "not-needed", reason, "", row.range_text)
    parent, name, current = _resolve(row.module, row.attribute)
    original = parent.__dict__.get(name, current) if isinstance(parent, type) else current
    wrapt.wrap_function_wrapper(parent, name, row.wrapper(runtime, row))
    _applied[row.seam] = _Applied(row, parent, name, original)
    return SeamStatus(row.seam, row.target, "patched", reason, row.failure_policy, row.range_text)


def _apply_by_signature(seam: str, runtime: Runtime, host_version: str) -> SeamStatus:
    """A release outside every range: the newest row whose target verifies, or nothing."""
    tried: list[str] = []
    for row in fallback_rows(seam):
        problem = verify_row(row)
        if problem is None:
            return _apply(row, runtime, f"Hermes {host_version} is not in the seam table; target verified by "
                                        f"signature, using the row for {row.range_text}")
        tried.append(f"row {row.range_text}: {problem}")
    return SeamStatus(seam, "-", "skipped",
                      f"Hermes {host_version} is not in the seam table and no row's target verifies "
                      f"({'; '.join(tried)}); not patched", "")


def _status_for(seam: str, runtime: Runtime, host_version: str | None) -> SeamStatus:
    if host_version is None:
        return SeamStatus(seam, "-", "skipped", "hermes-agent is not installed", "")
    parsed = parse_version(host_version)
    row = select_row(seam, parsed)
    if row is not None:
        return _apply(row, runtime, row.note)
    if runtime.host_in_table:
        return SeamStatus(seam, "-", "skipped", f"the seam table has no {seam} row for Hermes {host_version}", "")
    oldest = oldest_supported(seam)
    if oldest is not None and parsed < oldest:
        return SeamStatus(seam, "-", "skipped",
                          f"Hermes {host_version} is older than the oldest supported release "
                          f"{version_text(oldest)}; not patched", "")
    return _apply_by_signature(seam, runtime, host_version)


def _report_untested(runtime: Runtime) -> None:
    """One warning line per process and host version for a release outside the table."""
    key = f"{runtime.host_version}|" + "|".join(f"{s.name}={s.state}" for s in runtime.seams)
    if key in _reported:
        return
    _reported.add(key)
    log.warning("session guard: %s", runtime.compat_note)


def install(config: GuardConfig | None = None, *, version: str | None = None) -> Runtime:
    """Patch every seam the installed Hermes supports. Calling it again only
    updates the configuration; seams are never wrapped twice. ``version``
    overrides the installed version (tests; embedders that vendor Hermes)."""
    global _runtime
    with _lock:
        config = config or GuardConfig()
        if _runtime is not None:
            _runtime.config = config
            return _runtime
        host_version = version or installed_version()
        runtime = Runtime(config=config, host_version=host_version)
        parsed = parse_version(host_version) if host_version else None
        runtime.host_in_table = parsed is not None and host_in_table(parsed)
        for seam in seam_names():
            try:
                status = _status_for(seam, runtime, host_version)
            except Exception as exc:
                row = select_row(seam, parsed)
                status = SeamStatus(seam, row.target if row else "-", "failed", f"{type(exc).__name__}: {exc}",
                                    row.failure_policy if row else "")
            runtime.seams.append(status)
        if host_version is not None and not runtime.host_in_table:
            runtime.compat_note = _untested_note(host_version, runtime.seams)
            _report_untested(runtime)
        else:
            for status in runtime.seams:
                if status.state not in ("patched", "not-needed"):
                    log.warning("session guard: seam %s %s: %s", status.name, status.state, status.reason)
        _runtime = runtime
        runtime.audit.logger(session_id=None, op_id=None).info(
            "guard.installed", host_version=host_version, host_in_table=runtime.host_in_table,
            seams={s.name: s.state for s in runtime.seams},
        )
        return runtime


def _untested_note(host_version: str, statuses: list[SeamStatus]) -> str:
    patched = [f"{s.name} -> {s.target} (row {s.row})" for s in statuses if s.state == "patched"]
    skipped = [f"{s.name} ({s.reason})" for s in statuses if s.state != "patched"]
    return (
        f"Hermes {host_version} is not a tested release (tested: {', '.join(TESTED_RELEASES)}); "
        f"a seam is patched only where its target verifies by signature. "
        f"Patched: {', '.join(patched) or 'none'}. Skipped: {', '.join(skipped) or 'none'}."
    )


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
