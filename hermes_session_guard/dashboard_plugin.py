"""The guard in ``hermes dashboard``'s process, which loads no agent plugins.

Hermes starts its web dashboard (``hermes_cli/web_server.py``) without agent
plugin discovery on every release, so the entry-point plugin that switches the
guard on in agents never runs there. On 0.13-0.17 that means the dashboard's
search and export hold the live transcript only: the compacted turns live in
the guard's snapshots, which only a guarded ``SessionDB`` reads.

The dashboard does load *dashboard* plugins: a directory
``$HERMES_HOME/plugins/<name>/dashboard/`` with a ``manifest.json`` whose
``api`` file it imports at start and mounts under ``/api/plugins/<name>/``.
``enable`` writes such a directory (:data:`DIR_NAME`); its ``api.py`` calls
:func:`activate`, which switches the guard on in the dashboard's process when,
and only when, the home's config.yaml enables the guard (the same rule Hermes
applies to the agent plugin), and serves ``GET /api/plugins/session-guard/status``,
``/compactions`` (the records ``status --session`` prints, for the "Compactions" tab,
whose page is ``dashboard_page/index.js``) and ``/compaction?session=&op=`` (one compaction
opened: the original turns it replaced, from its snapshot, masked as hand-off packets are).
Hermes's dashboard puts its own auth in front of every plugin route; 0.19+ mounts them when
``session-guard`` is in ``plugins.enabled``, as ``enable`` leaves it.
``disable`` removes the directory. The directory holds no ``plugin.yaml``, so
Hermes's agent-plugin discovery passes over it.

Writing it never follows a symbolic link: the new directory is built next to
the old one under a hidden name (:func:`stage`, every name created exclusively,
directories ``0700``, files ``0600``, owned like ``plugins/`` when root runs
``enable``) and renamed into place (:func:`commit`); an existing directory that
holds a link, or is one, is refused before anything is written. ``enable``
stages before it touches config.yaml, so a ``plugins/`` it cannot write leaves
config.yaml as it was.

Failure policy: open. Anything that goes wrong here leaves the dashboard
running unguarded (search and export without the snapshots) with one error
line naming the cause; :func:`activate` never raises into the dashboard.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import time
from contextlib import ExitStack, suppress
from importlib import resources
from pathlib import Path
from typing import Any

from .fail_open import failing_open
from .file_modes import home_owner, links_under, open_dir, write_private_tree

log = logging.getLogger("hermes_session_guard")

DIR_NAME = "session-guard-dashboard"
PLUGIN_NAME = "session-guard"

MANIFEST = {
    "name": PLUGIN_NAME,
    "label": "Compactions",
    "description": "hermes-session-guard: every recorded context compaction, and the guard on in the dashboard "
                   "process (search and export reach compacted history).",
    "icon": "Database",
    "version": "2",
    "tab": {"path": f"/{PLUGIN_NAME}", "position": "after:sessions"},
    "entry": "dist/index.js",
    "api": "api.py",
}

API_SOURCE = '''"""Written by `hermes-session-guard enable`; removed by `hermes-session-guard disable`.
Hermes's dashboard imports this file at start: it switches the session guard on in the
dashboard's process when this home enables it (search and export then reach compacted history)."""

from hermes_session_guard.dashboard_plugin import activate

router = activate()
'''

# The tab's page (React through the dashboard's plugin SDK), shipped as package data.
SCRIPT_SOURCE = resources.files(__package__).joinpath("dashboard_page", "index.js").read_text(encoding="utf-8")
COMPACTIONS_LIMIT = 1000  # most rows one request of the tab returns


FILES: dict[str, bytes] = {
    "dashboard/manifest.json": (json.dumps(MANIFEST, indent=2) + "\n").encode("utf-8"),
    "dashboard/api.py": API_SOURCE.encode("utf-8"),
    "dashboard/dist/index.js": SCRIPT_SOURCE.encode("utf-8"),
}
LEFTOVER_SECONDS = 3600.0  # a hidden staging directory this old is a killed run's, not a running one's
_STAGED = re.compile(rf"^\.{re.escape(DIR_NAME)}\.[0-9a-f]+\.(new|old)$")


class DashboardPluginError(OSError):
    """The dashboard plugin directory cannot be written or removed safely; the message says why."""


def plugin_dir(home: Path) -> Path:
    return Path(home) / "plugins" / DIR_NAME


def check(home: Path, *, removing: bool = False) -> None:
    """Raise :class:`DashboardPluginError` where :func:`stage` and :func:`commit` (or, with
    ``removing``, :func:`detach`) would refuse; writes nothing. Links inside the plugin
    directory do not stop its removal: nothing in it is opened, links are deleted as links."""
    plugins = Path(home) / "plugins"
    if os.path.islink(plugins) or (os.path.lexists(plugins) and not os.path.isdir(plugins)):
        raise DashboardPluginError(f"{plugins} is a symbolic link or not a directory; the guard writes its dashboard "
                                   "plugin only into a real directory")
    bad = [] if removing else links_under(plugin_dir(home))
    if bad:
        raise DashboardPluginError(f"{bad[0]} is a symbolic link or not a regular file; remove "
                                   f"{plugin_dir(home)} and run the command again")


def _remove_tree(path: Path) -> None:
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.lexists(path):
        shutil.rmtree(path)  # never follows a link inside (fd-based on POSIX)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > seconds
    except OSError:
        return False


def stage(home: Path) -> Path:
    """Build the plugin directory under a hidden name in ``plugins/`` (created if missing)
    and return it; nothing in place changes. Raises :class:`OSError`."""
    home = Path(home)
    check(home)
    plugins = home / "plugins"
    if not os.path.lexists(plugins):
        with open_dir(plugins, home=home, create=True):
            pass  # made 0700, the home owner's, no link followed
        check(home)
    for leftover in os.listdir(plugins):  # of a run killed between stage and commit, not one running now
        if _STAGED.match(leftover) and _older_than(plugins / leftover, LEFTOVER_SECONDS):
            _remove_tree(plugins / leftover)
    staged = plugins / f".{DIR_NAME}.{secrets.token_hex(6)}.new"
    written = False
    try:
        write_private_tree(staged, FILES, owner=home_owner(home))
        written = True
    finally:
        if not written:
            with suppress(OSError):
                _remove_tree(staged)
    return staged


def commit(home: Path, staged: Path) -> Path:
    """Put a directory made by :func:`stage` in place of the old one (which is removed)."""
    root = plugin_dir(home)
    with ExitStack() as undo:  # on any failure, newest first: the old directory back, the staged one gone
        undo.callback(discard, staged)
        check(home)
        aside = detach(home)
        if aside is not None:
            undo.callback(reattach, home, aside)
        os.rename(staged, root)
        undo.pop_all()  # in place: nothing to undo
    if aside is not None:
        discard(aside)
    return root


def discard(path: Path | None) -> None:
    """Remove a staged or detached directory; errors are left unreported (it is hidden and
    the next :func:`stage` removes leftovers)."""
    if path is None:
        return
    try:
        _remove_tree(path)
    except OSError:
        pass


def detach(home: Path, noted: list[Path | None] | None = None) -> Path | None:
    """Move the plugin directory out of Hermes's sight (a hidden name in ``plugins/``) and
    return where it went; ``None`` when there is none. The hidden name is added to
    ``noted`` before the move (an interrupt right after it still finds the directory).
    Raises :class:`OSError`."""
    root = plugin_dir(home)
    if not os.path.lexists(root):
        return None
    check(home, removing=True)
    aside = root.with_name(f".{DIR_NAME}.{secrets.token_hex(6)}.old")
    if noted is not None:
        noted.append(aside)
    os.rename(root, aside)  # a link is renamed itself, never followed
    return aside


def reattach(home: Path, aside: Path) -> None:
    """Undo :func:`detach`."""
    os.rename(aside, plugin_dir(home))


def write(home: Path) -> Path:
    """Write (or rewrite) the dashboard plugin directory under ``home``; returns it."""
    return commit(home, stage(home))


def _router() -> Any:
    try:
        from fastapi import APIRouter
    except ImportError:  # not a dashboard process; nothing to mount
        return None
    router = APIRouter()

    @router.get("/status")
    def status() -> dict[str, Any]:
        from .runtime import current_runtime

        runtime = current_runtime()
        if runtime is None:
            return {"guard": "off", "patched": []}
        return {"guard": "on", "patched": sorted(s.name for s in runtime.seams if str(s.state) == "patched")}

    @router.get("/compactions")
    def compactions(session: str | None = None, limit: int = 200) -> dict[str, Any]:
        """The recorded compactions, newest first: of ``session``, or the latest of any."""
        return compactions_of(session, limit)

    @router.get("/compaction")
    def compaction(session: str, op: str) -> dict[str, Any]:
        """One compaction opened: its record and the original turns it replaced, masked."""
        return originals_of(session, op)

    return router


def compactions_of(session: str | None, limit: int) -> dict[str, Any]:
    """What the tab shows: the guard's records of compactions in this home's state.db
    (ids, outcomes, counts, times, reasons), read through the guard's own store."""
    from .hostinfo import hermes_home
    from .maintenance.compaction_records import record_of
    from .runtime import current_runtime

    runtime = current_runtime()
    if runtime is None:
        return {"guard": "off", "compactions": []}
    db = hermes_home() / "state.db"
    if not db.is_file():
        return {"guard": "on", "compactions": []}
    limit = max(1, min(int(limit), COMPACTIONS_LIMIT))
    store = runtime.store_for(db)
    rows = list(reversed(store.compressions(session)))[:limit] if session else store.latest_compressions(limit)
    now, lease = time.time(), runtime.config.lock.lease_seconds
    return {"guard": "on",
            "compactions": [{"session_id": r.get("session_id"), **record_of(r, now, lease)} for r in rows]}


def originals_of(session: str, op: str) -> dict[str, Any]:
    """One recorded compaction of ``session`` and the original turns it replaced, read from
    its snapshot through the guard's store: the turns its summary stands for (the range
    recorded with the summary; the whole snapshot when none was recorded), each text masked
    as in hand-off packets (the guard's secret rules, :func:`~.redaction_core.mask_secrets`, then
    Hermes's own pass under its bounds). Nothing of
    it is logged; the dashboard's auth guards the route like every plugin route."""
    from . import host
    from .hostinfo import hermes_home
    from .maintenance.compaction_records import record_of
    from .redaction_core import host_pass, mask_secrets
    from .runtime import current_runtime
    from .store import message_text

    runtime = current_runtime()
    if runtime is None:
        return {"guard": "off", "compaction": None, "turns": []}
    db = hermes_home() / "state.db"
    row = next((r for r in runtime.store_for(db).compressions(session) if r.get("op_id") == op),
               None) if db.is_file() else None
    if row is None:
        return {"guard": "on", "compaction": None, "turns": []}
    store = runtime.store_for(db)
    record = {"session_id": session, **record_of(row, time.time(), runtime.config.lock.lease_seconds)}
    snapshot_id = row.get("snapshot_id")
    info = store.snapshot_info(snapshot_id) if snapshot_id else None
    if info is None or info.session_id != session:
        return {"guard": "on", "compaction": record, "turns": [], "first_turn": None, "last_turn": None}
    first, last = store.compacted_ranges([session]).get(
        info.snapshot_id, (info.first_turn or 1, info.last_turn or (info.first_turn or 1) + info.message_count - 1))
    masker = host.host_redactor()
    turns = [{"turn": n, "role": str(m.get("role") or ""),
              "content": host_pass(mask_secrets(message_text(m) or ""), masker)}
             for n, m in store.snapshot_turns(info.snapshot_id, first, last)]
    return {"guard": "on", "compaction": record, "first_turn": first, "last_turn": last, "turns": turns}


def activate() -> Any:
    """Switch the guard on in this (dashboard) process when the home enables it, as the
    agent plugin would; return the router the dashboard mounts. Never raises."""
    router = None
    with failing_open("switching the guard on in the dashboard", "its search and export hold the live transcript "
                      "only"):
        router = _router()
        from .config import ConfigError, load_config
        from .hostinfo import hermes_home
        from .maintenance.plugin_config import guard_enabled
        from .seams.apply import switch_on

        home = hermes_home()
        enabled, why = guard_enabled(home)
        if not enabled:
            log.info("session guard: not switched on in the dashboard process: %s", why)
            return router
        try:
            config = load_config(home)
        except ConfigError as exc:
            log.error("session guard DISABLED in the dashboard: invalid config.yaml option %s (%s); its search "
                      "and export hold the live transcript only. Fix the option and restart the dashboard.",
                      exc.key, exc)
            return router
        runtime = switch_on(config)
        if runtime is not None:
            from .seams.summaries import hide_in_dashboard

            hidden = hide_in_dashboard(runtime)
            log.info("session guard: on in the dashboard process (search and export reach compacted history%s)",
                     "; the session messages view shows no summary" if hidden else "")
    return router
