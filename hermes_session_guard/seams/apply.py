"""Apply and remove the seam table's patches: idempotent ``install`` / ``uninstall``.

Which row a seam gets: on a release the seam table covers, the row for that
release; on a newer release (or one between rows) the newest row whose target
exists with the declared leading parameters and whose ``requires`` names exist
("verified by signature"); on an older release, none. Every row is verified
before it is applied, on any release.

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

Why one module: installing, verifying, deferring (pending and lazy rows) and
uninstalling share one registry of what is applied (``_applied``); each needs the others'
bookkeeping to stay idempotent and reversible.
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

from ..config import GuardConfig, parse_config
from ..fail_open import failing_open
from ..host import close_readers, unshim_adapters, unshim_dashboards, unshim_engines
from ..hostinfo import installed_version, parse_version
from ..runtime import Runtime, SeamStatus, current_runtime, set_current_runtime
from ..seam_behaviour import Effect, SeamKind, SeamState
from . import verification
from .envelope import enveloped
from .table import (
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
    parent: Any
    name: str
    original: Any  # the host's own attribute, before any seam wrapped it
    own: bool = True  # False: the class inherited it, so restoring deletes the class's copy


def _original_of(parent: Any, name: str, current: Any) -> tuple[Any, bool]:
    """What the host had at ``parent.name`` before the guard, and whether ``parent``
    held it itself (a class may inherit it)."""
    if isinstance(parent, type):
        return parent.__dict__.get(name, current), name in parent.__dict__
    return current, True


def _restore(applied: _Applied) -> None:
    if applied.own:
        setattr(applied.parent, applied.name, applied.original)
    elif applied.name in vars(applied.parent):
        delattr(applied.parent, applied.name)  # inherited: the base class's attribute shows through again


@dataclass
class _Candidates:
    """The rows a pending seam may get, best first: one row on a tested release,
    the fallback order on a release outside the table."""

    rows: list[SeamRow]
    by_signature: bool
    reason: str = ""  # why these rows (a release outside the table); "" for "verified by signature"

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(row.module for row in self.rows))

    @property
    def first(self) -> SeamRow:
        return self.rows[0]


_lock = threading.RLock()
_applied: dict[str, _Applied] = {}
_pending: dict[str, _Candidates] = {}
_imported: set[str] = set()  # modules a post-import hook saw complete (still flagged as importing)
_generation = 0
_busy = threading.local()
_reported: set[str] = set()


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
    if not params:  # declared as taking none (toolset_keys): it still takes none
        return not names
    return names[: len(params)] == list(params)


def module_state(name: str) -> str:
    """``ready`` (fully imported), ``importing`` (half built, in ``sys.modules``) or ``absent``."""
    module = sys.modules.get(name)
    if module is None:
        return "absent"
    spec = getattr(module, "__spec__", None)
    return "importing" if spec is not None and getattr(spec, "_initializing", False) else "ready"


def _ready(module: str) -> bool:
    return module in _imported or module_state(module) == "ready"


def verify_row(row: SeamRow) -> str | None:
    """``None`` when the installed host has what the row relies on: its target with
    the declared leading parameters (rows that wrap something) and every name in
    ``requires``; else why not. An instance shim's target is the host attribute its
    objects get their own copy of. Imports the target's module (callers do not call it
    for a lazy row whose module Hermes has not imported)."""
    if row.patches:
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
        return SeamStatus(row.seam, row.target, SeamState.SKIPPED, problem, row.failure_policy, row.range_text)
    runtime.behaviour[row.seam] = row.behaviour
    if row.kind is SeamKind.INSTANCE_SHIM:
        # Verified here; the objects get their attribute from the named function when the
        # guard reaches them, and lose it in uninstall.
        by = getattr(row.applied_by, "__name__", "?")
        return SeamStatus(row.seam, row.target, SeamState.PATCHED, f"instance shim, applied by {by}: {reason}",
                          row.failure_policy, row.range_text)
    if row.wrapper is None:
        # The host already does what this seam would add; the row's note says how.
        return SeamStatus(row.seam, row.target, SeamState.NOT_NEEDED, reason, "", row.range_text)
    parent, name, current = _resolve(row.module, row.attribute)
    taken = next((seam for seam, a in _applied.items() if a.parent is parent and a.name == name), None)
    if taken is not None:  # one wrapper per Hermes target (the table's invariant): never a second layer
        return SeamStatus(row.seam, row.target, SeamState.FAILED, f"{row.target} is already wrapped by seam {taken}",
                          row.failure_policy, row.range_text)
    original, own = _original_of(parent, name, current)
    # the row's failure policy is applied around its wrapper in one place (envelope.py)
    wrapt.wrap_function_wrapper(parent, name, enveloped(row, row.wrapper(runtime, row)))
    _applied[row.seam] = _Applied(parent, name, original, own)
    return SeamStatus(row.seam, row.target, SeamState.PATCHED, reason, row.failure_policy, row.range_text)


def _apply_candidates(candidates: _Candidates, runtime: Runtime) -> SeamStatus:
    """Apply the row for a seam: the single row of a tested release, or the newest
    candidate that verifies (skipping lazy rows whose module Hermes has not imported)."""
    if not candidates.by_signature:
        row = candidates.first
        return _apply(row, runtime, row.note)
    tried: list[str] = []
    for row in candidates.rows:
        if row.lazy and row.patches and not _ready(row.module):
            tried.append(f"row {row.range_text}: {row.module} not imported by Hermes")
            continue
        problem = verify_row(row)
        if problem is None:
            how = candidates.reason or "target verified by signature"
            return _apply(row, runtime, f"Hermes {runtime.host_version} is not in the seam table; {how}, using "
                                        f"the row for {row.range_text}")
        tried.append(f"row {row.range_text}: {problem}")
    seam = candidates.first.seam
    return SeamStatus(seam, "-", SeamState.SKIPPED,
                      f"Hermes {runtime.host_version} is not in the seam table and no row's target verifies "
                      f"({'; '.join(tried)}); not patched", "")


def _apply_logged(candidates: _Candidates, runtime: Runtime) -> SeamStatus:
    row = candidates.first
    with failing_open(row, "the seam is not patched", level=None) as failed:
        status = _apply_candidates(candidates, runtime)
    if failed:
        status = SeamStatus(row.seam, row.target, SeamState.FAILED, failed.reason, row.failure_policy)
    if status.state not in (SeamState.PATCHED, SeamState.NOT_NEEDED) and not candidates.by_signature:
        log.warning("session guard: seam %s %s: %s", status.name, status.state, status.reason)
    return status


def _set_status(runtime: Runtime, status: SeamStatus) -> None:
    for i, existing in enumerate(runtime.seams):
        if existing.name == status.name:
            runtime.seams[i] = status
            break
    else:
        runtime.seams.append(status)
    if runtime.host_version is not None and not runtime.host_in_table:
        plan = runtime.verification
        note = plan.note() if isinstance(plan, verification.Plan) else ""
        runtime.compat_note = _untested_note(runtime.host_version, runtime.seams, runtime.unverified_seams) + note


def _pending_status(row: SeamRow, why: str) -> SeamStatus:
    return SeamStatus(row.seam, row.target, SeamState.PENDING, why, row.failure_policy)


def apply_pending() -> None:
    """Patch every pending seam whose module is now fully imported. Never blocks:
    it runs inside the import machinery, so it gives up if another thread holds the lock."""
    if not _pending or getattr(_busy, "active", False):
        return
    if not _lock.acquire(blocking=False):
        return
    _busy.active = True
    try:
        runtime = current_runtime()
        while runtime is not None:
            ready = [(seam, c) for seam, c in _pending.items() if any(_ready(m) for m in c.modules)]
            if not ready:
                break
            for seam, candidates in ready:
                del _pending[seam]
                status = _apply_logged(candidates, runtime)
                _set_status(runtime, status)
                if candidates.by_signature and status.state not in (SeamState.PATCHED, SeamState.NOT_NEEDED):
                    _report_untested(runtime)
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
    return any(m in sys.modules for c in _pending.values() for m in c.modules)


def _watch(generation: int) -> None:
    deadline = time.monotonic() + _WATCH_LIMIT
    while generation == _generation and _half_built_pending() and time.monotonic() < deadline:
        time.sleep(_WATCH_INTERVAL)
        apply_pending()


def _add_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)  # first, or the path finder answers before it is asked


def _remove_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def _when_imported(seam: str, module_name: str, generation: int) -> Any:
    def hook(module: Any) -> None:
        if generation != _generation or seam not in _pending:
            return
        _imported.add(getattr(module, "__name__", module_name))
        _add_finder()  # in case the lock is busy right now
        apply_pending()

    return hook


def _schedule(candidates: _Candidates | SeamRow, runtime: Runtime) -> SeamStatus:
    """Apply now, or wait for Hermes to (finish) import(ing) the module."""
    if isinstance(candidates, SeamRow):
        candidates = _Candidates([candidates], by_signature=False)
    row = candidates.first
    seam = row.seam
    wraps = [r for r in candidates.rows if r.patches]
    if not wraps:
        return _apply_logged(candidates, runtime)
    states = {m: module_state(m) for m in candidates.modules}
    if all(r.lazy for r in wraps) and all(s == "absent" for s in states.values()):
        _pending[seam] = candidates
        for module_name in candidates.modules:
            wrapt.register_post_import_hook(_when_imported(seam, module_name, _generation), module_name)
        if seam in _pending:
            return _pending_status(row, f"patched when Hermes imports {' or '.join(candidates.modules)}")
        return next(s for s in runtime.seams if s.name == seam)
    for module_name, state in states.items():
        if state == "absent" and not all(r.lazy for r in wraps if r.module == module_name):
            # verification says why, for the rows that needed it
            with failing_open(f"importing {module_name}", "its rows are verified against a module that is not there",
                              level=logging.DEBUG, advice=None) as failed:
                importlib.import_module(module_name)
            if failed:
                continue
            states[module_name] = module_state(module_name)
    if any(state == "importing" for state in states.values()):
        first = not _half_built_pending()
        _pending[seam] = candidates
        _add_finder()
        if first:
            threading.Thread(target=_watch, args=(_generation,), name="session-guard-seams", daemon=True).start()
        return _pending_status(row, f"patched once {' or '.join(candidates.modules)} finishes importing")
    return _apply_logged(candidates, runtime)


def _candidates_for(seam: str, runtime: Runtime) -> _Candidates | SeamStatus:
    host_version = runtime.host_version
    if host_version is None:
        return SeamStatus(seam, "-", SeamState.SKIPPED, "hermes-agent is not installed", "")
    parsed = parse_version(host_version)
    row = select_row(seam, parsed)
    if row is not None:
        return _Candidates([row], by_signature=False)
    if runtime.host_in_table:
        return SeamStatus(seam, "-", SeamState.SKIPPED,
                          f"the seam table has no {seam} row for Hermes {host_version}", "")
    oldest = oldest_supported(seam)
    if oldest is not None and parsed < oldest:
        return SeamStatus(seam, "-", SeamState.SKIPPED,
                          f"Hermes {host_version} is older than the oldest supported release "
                          f"{version_text(oldest)}; not patched", "")
    plan = runtime.verification
    chosen = plan.candidates(seam) if isinstance(plan, verification.Plan) else None
    if chosen is not None:
        rows, reason = chosen
        if rows:
            return _Candidates(rows, by_signature=True, reason=reason)
        return SeamStatus(seam, "-", SeamState.SKIPPED,
                          f"Hermes {host_version}: no row of the seam table has the behaviour this Hermes's "
                          f"capabilities call for ({reason}); not patched", "")
    rows = [row for row in fallback_rows(seam) if row.effect is Effect.OBSERVE]
    if not rows:
        runtime.unverified_seams.add(seam)
        # Compression, locks, turn order, buffering, delivery, requests: a matching signature
        # says nothing about what the code behind it now does (0.20's holder-checked commit
        # refused every compaction a 0.19 row ran), so such a seam waits for a table row, or
        # for selftest to verify it on this install (seams/verification.py).
        why = verification.UNCHECKED_REASON if seam in verification.UNCHECKED else \
            "run `hermes-session-guard selftest` to verify it on this install"
        return SeamStatus(seam, "-", SeamState.SKIPPED,
                          f"Hermes {host_version} is newer than the seam table (tested up to "
                          f"{TESTED_RELEASES[-1]}); this seam changes what Hermes does and is never patched on a "
                          f"signature match alone ({why})", "")
    return _Candidates(rows, by_signature=True)


def _newest() -> tuple[int, ...]:
    return max(parse_version(version) for version in TESTED_RELEASES)


def _report_untested(runtime: Runtime) -> None:
    """One warning line per process and outcome for a release outside the table (an info line
    once selftest verified the install)."""
    key = f"{runtime.host_version}|" + "|".join(f"{s.name}={s.state}" for s in runtime.seams)
    if key in _reported:
        return
    _reported.add(key)
    plan = runtime.verification
    verified = isinstance(plan, verification.Plan) and plan.mode == verification.VERIFIED
    log.log(logging.INFO if verified else logging.WARNING, "session guard: %s", runtime.compat_note)


def install(config: GuardConfig | None = None, *, version: str | None = None) -> Runtime:
    """Patch every seam the installed Hermes supports. Calling it again only
    updates the configuration; seams are never wrapped twice. ``version``
    overrides the installed version (tests; embedders that vendor Hermes)."""
    with _lock:
        config = config or GuardConfig()
        current = current_runtime()
        if current is not None:
            current.config = config
            apply_pending()
            return current
        host_version = version or installed_version()
        runtime = Runtime(config=config, host_version=host_version)
        set_current_runtime(runtime)
        parsed = parse_version(host_version) if host_version else None
        runtime.host_in_table = parsed is not None and host_in_table(parsed)
        if host_version is not None and not runtime.host_in_table and parsed is not None and parsed > _newest():
            with failing_open("reading this install's verification", "only read-only seams are patched",
                              level=logging.WARNING) as failed:
                runtime.verification = verification.plan_for(host_version)
            if failed:
                runtime.verification = verification.Plan(verification.UNVERIFIED, problem=failed.reason)
        for seam in seam_names():
            found = _candidates_for(seam, runtime)
            if isinstance(found, SeamStatus):
                _set_status(runtime, found)
                if runtime.host_in_table or host_version is None:
                    log.warning("session guard: seam %s skipped: %s", seam, found.reason)
                continue
            _set_status(runtime, _pending_status(found.first, "installing"))
            _set_status(runtime, _schedule(found, runtime))
        if host_version is not None and not runtime.host_in_table:
            _report_untested(runtime)
        runtime.audit.logger(session_id=None, op_id=None).info(
            "guard.installed", host_version=host_version, host_in_table=runtime.host_in_table,
            seams={s.name: s.state for s in runtime.seams},
        )
        return runtime


_warned: set[str] = set()  # the fallback options already logged in this process


def switch_on(config: GuardConfig | dict[str, Any] | None = None) -> Runtime | None:
    """The entry points' install (the package's :func:`~hermes_session_guard.install`, the
    dashboard plugin): ``config`` is a :class:`GuardConfig`, the raw ``session_guard`` mapping,
    or ``None`` for the defaults. Each option that kept its default is logged once per process;
    ``enabled: false`` uninstalls and returns None; otherwise :func:`install`. Idempotent."""
    if not isinstance(config, GuardConfig):
        config = parse_config(config)
    for fallback in config.fallbacks:
        if fallback.describe() in _warned:  # Hermes may load the plugin more than once per process
            continue
        _warned.add(fallback.describe())
        log.warning("session guard: config.yaml option %s; the guard stays on, fix or remove the option",
                    fallback.describe())
    if not config.enabled:
        log.info("session guard: disabled by session_guard.enabled: false")
        uninstall()
        return None
    return install(config)


def _untested_note(host_version: str, statuses: list[SeamStatus], unverified: set[str] | frozenset[str] = frozenset()
                   ) -> str:
    """One short line: the compression seam's row, how many others were patched by
    signature, and which were skipped or wait for an import (the per-seam reasons are
    in the seam list ``selftest`` prints); seams left off until selftest verifies them
    (``unverified``) are counted, not named."""
    patched = [s for s in statuses if s.state in (SeamState.PATCHED, SeamState.NOT_NEEDED)]
    waiting = [s.name for s in statuses if s.state == SeamState.PENDING]
    skipped = [f"{s.name} ({_short(s.reason)})" for s in statuses if s.name not in unverified
               and s.state not in (SeamState.PATCHED, SeamState.NOT_NEEDED, SeamState.PENDING)]
    left_off = [s for s in statuses if s.name in unverified and s.state == SeamState.SKIPPED]
    if left_off:
        first = any(s.name == "compression" for s in left_off)
        rest = len(left_off) - first
        text = "compression" if first else ""
        if rest:
            text += f"{' and ' if first else ''}{rest} {'more ' if first else ''}seams that change what Hermes does"
        skipped.insert(0, text)
    compression = next((s for s in patched if s.name == "compression"), None)
    others = len(patched) - (compression is not None)
    used = f"compression -> {compression.target} (row {compression.row}) and {others} more" if compression \
        else f"{others} seams" if others else "none"
    note = (f"Hermes {host_version} is not a tested release ({TESTED_RELEASES[0]} - {TESTED_RELEASES[-1]}); "
            f"patched by signature: {used}. Skipped: {', '.join(skipped) or 'none'}.")
    if waiting:
        note += f" Verified on import: {', '.join(waiting)}."
    return note


def _short(reason: str) -> str:
    """A skipped seam's reason in a few words: for a release outside the table, the
    first row tried and why it did not verify (the full list is in the seam's status)."""
    if "no row's target verifies (" not in reason:
        return reason if len(reason) <= 90 else reason[:87] + "..."
    first = reason.split("no row's target verifies (", 1)[1].split("; ")[0]
    problem = first.split(": ", 1)[-1].split(" (", 1)[0]
    return f"no row verifies: {problem}"


def uninstall() -> None:
    """Restore every patched host attribute exactly as it was."""
    global _generation
    with _lock:
        _generation += 1
        _pending.clear()
        _imported.clear()
        _remove_finder()
        # Two seams may wrap one attribute (the later one wraps the earlier one's
        # wrapper); each restores the host's own (see _original_of), so any order works.
        for seam in reversed(list(_applied)):
            _restore(_applied.pop(seam))
        unshim_engines()
        unshim_adapters()
        unshim_dashboards()
        close_readers()
        current = current_runtime()
        if current is not None:
            current.close()
        set_current_runtime(None)


def is_installed() -> bool:
    return current_runtime() is not None
