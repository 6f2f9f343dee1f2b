"""``selftest``: which seams are patched, then a live contract probe against the
installed Hermes in a temporary ``HERMES_HOME`` with the bundled loopback fake LLM."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .. import supported
from ..hostinfo import hermes_home, install_path, installed_version
from ..state_inspection import HomeError, check_home
from .output import fail

HELP = "Check the installed Hermes: seams patched and the session-id contract, live"
MARKER = "SESSION_GUARD_PROBE "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the live probe")


def run_probe(timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="session-guard-selftest-") as tmp:
        env = dict(os.environ, HERMES_HOME=tmp)
        env.pop("HERMES_SESSION_ID", None)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "hermes_session_guard.probe"],
                env=env, capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"live probe timed out after {timeout:.0f}s", "checks": [], "seams": []}
        for line in proc.stdout.splitlines():
            if MARKER in line:  # a host module may have left a partial line on stdout
                return json.loads(line.split(MARKER, 1)[1])
        return {"ok": False, "error": "live probe printed no result", "stderr": proc.stderr[-4000:],
                "checks": [], "seams": []}


PLUGIN_NAME = "session-guard"


def plugin_enabled(home: Any) -> tuple[bool, str]:
    """Whether the home's config.yaml enables the guard (``plugins.disabled`` wins)."""
    import yaml

    path = home / "config.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    plugins = data.get("plugins") if isinstance(data, dict) else None
    plugins = plugins if isinstance(plugins, dict) else {}
    enabled, disabled = plugins.get("enabled") or [], plugins.get("disabled") or []
    if PLUGIN_NAME in disabled:
        return False, f"{PLUGIN_NAME} is in plugins.disabled of {path}"
    if PLUGIN_NAME not in enabled:
        return False, f"{PLUGIN_NAME} is not in plugins.enabled of {path}; run `hermes plugins enable {PLUGIN_NAME}`"
    return True, str(path)


def run(args: argparse.Namespace) -> int:
    try:
        home, _config = check_home()
        enabled, where = plugin_enabled(home)
    except HomeError as exc:
        return fail(str(exc), args.json)
    except Exception as exc:  # an unreadable config.yaml
        return fail(f"cannot read {hermes_home() / 'config.yaml'}: {exc}", args.json)
    version = installed_version()
    report: dict[str, Any] = {"hermes_version": version, "hermes_path": install_path(),
                              "home": {"path": str(home), "config_valid": True, "guard_enabled": enabled,
                                       "detail": where}}
    if version is None:
        report.update(ok=False, error="hermes-agent is not installed in this Python environment "
                      f"({sys.executable}); install the guard into the environment Hermes runs from")
        probe: dict[str, Any] = {"checks": [], "seams": []}
    else:
        probe = run_probe(args.timeout)
        report.update(ok=bool(probe.get("ok")), seams=probe.get("seams", []), checks=probe.get("checks", []),
                      host_in_table=probe.get("host_in_table", True), compat_note=probe.get("compat_note", ""))
        if probe.get("error"):
            report["error"] = probe["error"]
    report.update(supported_hermes=f">={supported.SUPPORTED_LOW},<{supported.SUPPORTED_HIGH}",
                  hermes_in_supported_range=version is not None and supported.in_supported_range(version))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Hermes {version or 'not installed'} at {report.get('hermes_path') or '-'}")
        print(supported.describe(version))
        if report.get("compat_note"):
            print(f"UNTESTED RELEASE: {report['compat_note']}")
        print(f"HERMES_HOME {home}: session_guard config valid; guard "
              + ("enabled" if enabled else f"NOT enabled ({where})"))
        print("Seams:")
        for s in report.get("seams", []):
            row = f" [row {s['row']}]" if s.get("row") else ""
            print(f"  {s['name']:<20} {s['state']:<11} {s['target']}{row}  {s['reason']}")
        print("Contract (live probe, temporary HERMES_HOME, loopback fake LLM):")
        for c in report.get("checks", []):
            state = c.get("state") or ("pass" if c["ok"] else "fail")
            detail = f"  ({c['detail']})" if c["detail"] and state != "pass" else ""
            print(f"  [{state.upper()}] {c['name']}{detail}")
        if report.get("error"):
            print(f"error: {report['error']}")
            if probe.get("traceback"):
                print(probe["traceback"])
            if probe.get("stderr"):
                print(probe["stderr"])
        print("selftest: " + ("PASSED" if report["ok"] else "FAILED"))
    return 0 if report["ok"] else 1
