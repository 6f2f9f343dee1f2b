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
applies to the agent plugin), and serves ``GET /api/plugins/session-guard/status``.
``disable`` removes the directory. The directory holds no ``plugin.yaml``, so
Hermes's agent-plugin discovery passes over it.

Failure policy: open. Anything that goes wrong here leaves the dashboard
running unguarded (search and export without the snapshots) with one error
line naming the cause; :func:`activate` never raises into the dashboard.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from .file_modes import make_private_dirs, write_private_text

log = logging.getLogger("hermes_session_guard")

DIR_NAME = "session-guard-dashboard"
PLUGIN_NAME = "session-guard"
STATUS_PATH = f"/api/plugins/{PLUGIN_NAME}/status"

MANIFEST = {
    "name": PLUGIN_NAME,
    "label": "Session guard",
    "description": "Switches hermes-session-guard on in the dashboard process (search and export reach "
                   "compacted history). No page of its own.",
    "version": "1",
    "tab": {"path": f"/{PLUGIN_NAME}", "hidden": True},
    "entry": "dist/index.js",
    "api": "api.py",
}

API_SOURCE = '''"""Written by `hermes-session-guard enable`; removed by `hermes-session-guard disable`.
Hermes's dashboard imports this file at start: it switches the session guard on in the
dashboard's process when this home enables it (search and export then reach compacted history)."""

from hermes_session_guard.dashboard_plugin import activate

router = activate()
'''

# The dashboard loads a plugin's script even when its tab is hidden; this one adds nothing.
SCRIPT_SOURCE = "/* hermes-session-guard: no dashboard page; see api.py */\n"


def plugin_dir(home: Path) -> Path:
    return Path(home) / "plugins" / DIR_NAME


def write(home: Path) -> Path:
    """Write (or rewrite) the dashboard plugin directory under ``home``; returns it."""
    root = plugin_dir(home)
    dashboard = root / "dashboard"
    make_private_dirs(dashboard / "dist")
    write_private_text(dashboard / "manifest.json", json.dumps(MANIFEST, indent=2) + "\n")
    write_private_text(dashboard / "api.py", API_SOURCE)
    write_private_text(dashboard / "dist" / "index.js", SCRIPT_SOURCE)
    return root


def remove(home: Path) -> bool:
    """Remove the dashboard plugin directory; ``True`` when there was one."""
    root = plugin_dir(home)
    if not root.exists() and not root.is_symlink():
        return False
    if root.is_symlink() or not root.is_dir():
        root.unlink()
    else:
        shutil.rmtree(root)
    return True


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

    return router


def activate() -> Any:
    """Switch the guard on in this (dashboard) process when the home enables it, as the
    agent plugin would; return the router the dashboard mounts. Never raises."""
    router = None
    try:
        router = _router()
        from . import install
        from .config import ConfigError, load_config
        from .hostinfo import hermes_home
        from .maintenance.plugin_config import guard_enabled

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
        if install(config) is not None:
            log.info("session guard: on in the dashboard process (search and export reach compacted history)")
    except Exception as exc:
        log.error("session guard: could not switch the guard on in the dashboard (%s: %s); its search and export "
                  "hold the live transcript only. Run `hermes-session-guard selftest`.", type(exc).__name__, exc)
    return router
