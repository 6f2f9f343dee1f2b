"""Apply and remove the seam table's patches: idempotent ``install`` / ``uninstall``.

A row is patched as soon as its module is fully imported. Two cases wait:

* the module is *being* imported when the guard installs (Hermes discovers plugins
  while ``run_agent`` imports ``model_tools``, so ``run_agent`` is still half built):
  the row is ``pending`` and is patched as soon as the import finishes (checked on
  every later import through a no-op ``sys.meta_path`` finder, and every few
  milliseconds by a short-lived watcher thread, for a caller that uses the module
  before importing anything else);
* the row is ``lazy`` (display modules such as ``cli`` or ``tui_gateway.server``
  that the guard must never import itself): it is patched by a post-import hook
  when Hermes imports the module, and stays ``pending`` in processes that never do.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import wrapt

from .config import GuardConfig
from .host_adapter import close_readers, unshim_adapters, unshim_engines
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
_pending: dict[str, SeamRow] = {}
_imported: set[str] = set()  # modules a post-import hook saw complete (still flagged as importing)
_runtime: Runtime | None = None
_generation = 0
_busy = threading.local()


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


def module_state(name: str) -> str:
    """``ready`` (fully imported), ``importing`` (half built, in ``sys.modules``) or ``absent``."""
    module = sys.modules.get(name)
    if module is None:
        return "absent"
    spec = getattr(module, "__spec__", None)
    return "importing" if spec is not None and getattr(spec, "_initializing", False) else "ready"


def _apply(row: SeamRow, runtime: Runtime) -> SeamStatus:
    if row.wrapper is None:
        return SeamStatus(row.seam, row.target, "not-needed", row.note, "")
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


def _apply_logged(row: SeamRow, runtime: Runtime) -> SeamStatus:
    try:
        status = _apply(row, runtime)
    except Exception as exc:
        status = SeamStatus(row.seam, row.target, "failed", f"{type(exc).__name__}: {exc}", row.failure_policy)
    if status.state not in ("patched", "not-needed"):
        log.warning("session guard: seam %s %s: %s", status.name, status.state, status.reason)
    return status


def _set_status(runtime: Runtime, status: SeamStatus) -> None:
    for i, existing in enumerate(runtime.seams):
        if existing.name == status.name:
            runtime.seams[i] = status
            return
    runtime.seams.append(status)


def _pending_status(row: SeamRow, why: str) -> SeamStatus:
    return SeamStatus(row.seam, row.target, "pending", why, row.failure_policy)


def apply_pending() -> None:
    """Patch every pending row whose module is now fully imported. Never blocks:
    it runs inside the import machinery, so it gives up if another thread holds the lock."""
    if not _pending or getattr(_busy, "active", False):
        return
    if not _lock.acquire(blocking=False):
        return
    _busy.active = True
    try:
        runtime = _runtime
        while runtime is not None:
            ready = [
                (seam, row) for seam, row in _pending.items()
                if row.module in _imported or module_state(row.module) == "ready"
            ]
            if not ready:
                break
            for seam, row in ready:
                del _pending[seam]
                _set_status(runtime, _apply_logged(row, runtime))
        if not _half_built_pending():
            _remove_finder()  # what is left waits for a post-import hook
    finally:
        _busy.active = False
        _lock.release()


class _PendingSeamFinder:
    """A ``sys.meta_path`` entry that finds nothing; each import lookup gives the
    guard a chance to patch rows whose module has finished importing since."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        apply_pending()
        return None


_finder = _PendingSeamFinder()
_WATCH_INTERVAL = 0.002
_WATCH_LIMIT = 300.0


def _half_built_pending() -> bool:
    return any(row.module in sys.modules for row in _pending.values())


def _watch(generation: int) -> None:
    deadline = time.monotonic() + _WATCH_LIMIT
    while generation == _generation and _half_built_pending() and time.monotonic() < deadline:
        time.sleep(_WATCH_INTERVAL)
        apply_pending()


def _start_watcher() -> None:
    threading.Thread(target=_watch, args=(_generation,), name="session-guard-seams", daemon=True).start()


def _add_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)  # first, or the path finder answers before it is asked


def _remove_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def _when_imported(row: SeamRow, generation: int) -> Any:
    def hook(module: Any) -> None:
        if generation != _generation or row.seam not in _pending:
            return
        _imported.add(getattr(module, "__name__", row.module))
        _add_finder()  # in case the lock is busy right now
        apply_pending()

    return hook


def _schedule(row: SeamRow, runtime: Runtime) -> SeamStatus:
    state = module_state(row.module)
    if state == "absent" and row.wrapper is not None:
        if row.lazy:
            _pending[row.seam] = row
            wrapt.register_post_import_hook(_when_imported(row, _generation), row.module)
            if row.seam in _pending:
                return _pending_status(row, f"patched when Hermes imports {row.module}")
            return next(s for s in runtime.seams if s.name == row.seam)
        try:
            importlib.import_module(row.module)
        except Exception as exc:
            return SeamStatus(row.seam, row.target, "skipped", f"target not found ({exc})", row.failure_policy)
        state = module_state(row.module)
    if state == "importing" and row.wrapper is not None:
        first = not _half_built_pending()
        _pending[row.seam] = row
        _add_finder()
        if first:
            _start_watcher()
        return _pending_status(row, f"patched once {row.module} finishes importing")
    return _apply_logged(row, runtime)


def install(config: GuardConfig | None = None, *, version: str | None = None) -> Runtime:
    """Patch every seam the installed Hermes supports. Calling it again only
    updates the configuration; seams are never wrapped twice."""
    global _runtime
    with _lock:
        config = config or GuardConfig()
        if _runtime is not None:
            _runtime.config = config
            apply_pending()
            return _runtime
        host_version = version or installed_version()
        runtime = Runtime(config=config, host_version=host_version)
        _runtime = runtime
        parsed = parse_version(host_version) if host_version else None
        for seam in seam_names():
            row = select_row(seam, parsed)
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
            _set_status(runtime, _pending_status(row, "installing"))
            _set_status(runtime, _schedule(row, runtime))
        runtime.audit.logger(session_id=None, op_id=None).info(
            "guard.installed", host_version=host_version,
            seams={s.name: s.state for s in runtime.seams},
        )
        return runtime


def uninstall() -> None:
    """Restore every patched host attribute exactly as it was."""
    global _runtime, _generation
    with _lock:
        _generation += 1
        _pending.clear()
        _imported.clear()
        _remove_finder()
        # Last applied first: two seams may wrap one attribute (the later one wraps the
        # earlier one's wrapper), and each restores what it found.
        for seam in reversed(list(_applied)):
            applied = _applied.pop(seam)
            setattr(applied.parent, applied.name, applied.original)
        unshim_engines()
        unshim_adapters()
        close_readers()
        if _runtime is not None:
            _runtime.close()
        _runtime = None


def is_installed() -> bool:
    return _runtime is not None
