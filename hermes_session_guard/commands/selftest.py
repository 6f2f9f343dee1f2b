"""``selftest``: which seams are patched, then a live contract probe against the
installed Hermes in a temporary ``HERMES_HOME`` with the bundled loopback fake LLM."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from ..host import engines as engine_support
from ..hostinfo import FOUND_BY_MODULE, find_host, hermes_home
from ..maintenance.plugin_config import PluginConfigError, guard_enabled
from ..maintenance.state_inspection import HomeError, check
from ..maintenance.turns_elsewhere import turns_elsewhere
from ..seams import supported, verification
from .output import fail

HELP = "Check the installed Hermes: seams patched and the session-id contract, live"
MARKER = "SESSION_GUARD_PROBE "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # The probe imports Hermes and runs a compression against a loopback model: about 15 s
    # of CPU, which a loaded machine stretches well past a minute.
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for the live probe (default 180)")


def run_in_temp_home(name: str, argv: list[str], marker: str, what: str, timeout: float, *,
                     home_env: tuple[str, ...] = (), **env: str) -> dict[str, Any]:
    """Run ``python -m <argv>`` with a temporary ``HERMES_HOME`` (``0700``, removed after; also
    in each variable ``home_env`` names) and return the JSON it printed after ``marker``, or
    ``ok: False`` with the reason."""
    with tempfile.TemporaryDirectory(prefix=f"session-guard-{name}-") as tmp:
        os.chmod(tmp, 0o700)
        child_env = dict(os.environ, HERMES_HOME=tmp, **env, **dict.fromkeys(home_env, tmp))
        child_env.pop("HERMES_SESSION_ID", None)
        try:
            proc = subprocess.run([sys.executable, "-m", *argv], env=child_env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"{what} timed out after {timeout:.0f}s"}
        for line in proc.stdout.splitlines():
            if marker in line:  # a host module may have left a partial line on stdout
                return dict(json.loads(line.split(marker, 1)[1]))
        return {"ok": False, "error": f"{what} printed no result", "stderr": proc.stderr[-4000:]}


def run_probe(timeout: float) -> dict[str, Any]:
    # on a release outside the seam table the probe tries the capability-chosen seams (verification.TRIAL_ENV)
    return {"checks": [], "seams": [],
            **run_in_temp_home("selftest", ["hermes_session_guard.selftest.probe"], MARKER, "live probe", timeout,
                               home_env=(verification.TRIAL_ENV,))}


def user_home() -> tuple[Path | None, dict[str, Any]]:
    """The home to report on: HERMES_HOME when set, else ~/.hermes when it exists, else none
    (a machine where Hermes never ran: only the live probe runs, in its own temporary home).
    Raises HomeError or PluginConfigError for a home that fails the home check."""
    home = hermes_home()
    if not os.environ.get("HERMES_HOME", "").strip() and not home.exists() and not home.is_symlink():
        return None, {"path": str(home), "exists": False, "guard_enabled": False,
                      "detail": f"no Hermes home at {home} and HERMES_HOME is not set"}
    checked = check(home, empty_ok=True)
    enabled, where = guard_enabled(checked.home)
    return checked.home, {"path": str(checked.home), "exists": True, "config_valid": not checked.config.fallbacks,
                          "state_db": checked.has_db, "guard_enabled": enabled, "detail": where,
                          "option_defaults_used": [f.describe() for f in checked.config.fallbacks]}


def context_engine_report(home: Any, probe: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Which promises hold with the context engine the home's config.yaml selects
    (the live probe always runs Hermes's built-in compressor)."""
    patched = any(s.get("name") == "compression" and s.get("state") == "patched" for s in probe.get("seams", []))
    with failing_open("the context engine report", "the report says the engine was not found", level=None) as failed:
        found = engine_support.report_for_home(home, timeout)
    if failed:
        return {"configured": "?", "found": False, "error": failed.reason}
    if found.get("configured") == engine_support.BUILTIN_ENGINE and found.get("found"):
        return {"configured": engine_support.BUILTIN_ENGINE, "found": True, "builtin": True}
    if not patched and not found.get("error"):
        for promise in found.get("promises", []):
            promise.update(state=engine_support.NOT_HELD, detail="the compression seam is not patched")
        found["all_hold"] = False
    return found


def run(args: argparse.Namespace) -> int:
    try:
        home, home_report = user_home()
    except (HomeError, PluginConfigError) as exc:
        return fail(str(exc), args.json)
    found = find_host()
    version = found.version if found else None
    report: dict[str, Any] = {"hermes_version": version, "hermes_path": found.path if found else None,
                              "hermes_found_by": found.describe() if found else None, "home": home_report}
    protected = home is None or bool(home_report["guard_enabled"])
    if version is None:
        report.update(ok=False, error="Hermes is not installed in this Python environment "
                      f"({sys.executable}): no hermes-agent distribution and no importable hermes_cli; install "
                      "the guard into the environment Hermes runs from")
        probe: dict[str, Any] = {"checks": [], "seams": []}
    else:
        probe = run_probe(args.timeout)
        report.update(probe_ok=bool(probe.get("ok")), ok=bool(probe.get("ok")) and protected,
                      seams=probe.get("seams", []), checks=probe.get("checks", []),
                      host_in_table=probe.get("host_in_table", True), compat_note=probe.get("compat_note", ""))
        if probe.get("fingerprint"):
            report.update(verify_install(probe, protected))
        if probe.get("error"):
            report["error"] = probe["error"]
        elif not protected:
            report["error"] = (f"this home is NOT protected: the guard is not enabled in {home} "
                               f"({home_report['detail']})")
        if home is not None:
            report["context_engine"] = context_engine_report(home, probe, args.timeout)
        if home is not None and home_report["guard_enabled"]:  # turns in a process that does not load the guard
            report["turns_elsewhere"] = elsewhere = turns_elsewhere(home)
            if elsewhere["found"]:
                report.update(ok=False, error=report.get("error") or elsewhere["line"])
    report.update(supported_hermes=f">={supported.SUPPORTED_LOW},<{supported.SUPPORTED_HIGH}",
                  hermes_in_supported_range=version is not None and supported.in_supported_range(version))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Hermes {version or 'not installed'} at {report.get('hermes_path') or '-'}"
              + (f" (found by {report['hermes_found_by']})" if report.get("hermes_found_by") else ""))
        print(supported.describe(version, repackaged=None if found is None or found.found_by != FOUND_BY_MODULE
                                 else found.distribution or ""))
        if report.get("compat_note"):
            print(f"UNTESTED RELEASE: {report['compat_note']}")
        if home is None:
            print(f"Your Hermes home: none ({home_report['detail']}); nothing of yours to check, "
                  "the live probe below runs in its own temporary home")
        elif home_report["guard_enabled"]:
            print(f"HERMES_HOME {home}: session_guard config valid; guard enabled ({home_report['detail']})")
        else:
            print(f"HERMES_HOME {home}: NOT PROTECTED: the guard is not enabled in this home "
                  f"({home_report['detail']})")
        for used in home_report.get("option_defaults_used", []):
            print(f"  WARNING: config.yaml option {used}")
        print("Seams:")
        for s in report.get("seams", []):
            row = f" [row {s['row']}]" if s.get("row") else ""
            print(f"  {s['name']:<20} {s['state']:<11} {s['target']}{row}  {s['reason']}")
        print("Contract (live probe, temporary HERMES_HOME, loopback fake LLM):")
        for c in report.get("checks", []):
            state = c.get("state") or ("pass" if c["ok"] else "fail")
            detail = f"  ({c['detail']})" if c["detail"] and state != "pass" else ""
            print(f"  [{state.upper()}] {c['name']}{detail}")
        if report.get("verification"):
            print_verification(report["verification"])
        if report.get("context_engine"):
            engine_support.print_report(report["context_engine"])
        if report.get("error"):
            print(f"error: {report['error']}")
            if probe.get("traceback"):
                print(probe["traceback"])
            if probe.get("stderr"):
                print(probe["stderr"])
        engine = report.get("context_engine") or {}
        partial = [p["key"] for p in engine.get("promises", []) if p.get("state") != engine_support.HOLDS]
        note = (f" (with context engine {engine.get('configured')!r}: {len(partial)} promise(s) do not fully hold, "
                "see above)") if partial or engine.get("error") else ""
        if report["ok"]:
            verdict = "PASSED" + (f" (this home is protected: {home})" if home is not None else
                                  " (live probe only; there is no Hermes home on this machine to protect yet)")
        elif version is not None and report.get("probe_ok") and not protected:
            verdict = (f"FAILED: the live probe passed, but {home} is NOT protected "
                       "(run `hermes-session-guard enable`)")
        else:
            verdict = "FAILED"
        print("selftest: " + verdict + note)
    return 0 if report["ok"] else 1


def verify_install(probe: dict[str, Any], protected: bool) -> dict[str, Any]:
    """A release outside the seam table: what the probe verified, per promise, recorded for this
    install (every later process on it patches those seams). ``ok`` needs the compaction
    promise verified and recorded."""
    results = verification.evaluate(probe)
    out: dict[str, Any] = {"promises": [{"name": r.name, "verified": r.verified, "why": r.why}
                                        for r in [*results, verification.unchecked_result()]]}
    with failing_open("recording the verification", "this install stays on read-only seams", level=None) as failed:
        out["recorded"] = str(verification.write_record(verification.record_for(probe, results)))
    if failed:
        out["record_error"] = (f"{failed.reason}; run selftest as the user that owns {sys.prefix} (the Python "
                               "environment Hermes runs from)")
    compaction = next(r for r in results if r.name == verification.COMPACTION)
    ok = compaction.verified and not failed and protected
    report: dict[str, Any] = {"verification": out, "probe_ok": compaction.verified, "ok": ok}
    if not compaction.verified:
        report["error"] = f"compaction is NOT verified on this install: {compaction.why}"
    elif failed:
        report["error"] = f"the verification could not be recorded: {out['record_error']}"
    return report


def print_verification(found: dict[str, Any]) -> None:
    print("Verification on this install (live probe with the seams chosen by what this Hermes has):")
    for promise in found["promises"]:
        print(f"  [{'VERIFIED' if promise['verified'] else 'NOT VERIFIED'}] {promise['name']}: {promise['why']}")
    if found.get("recorded"):
        print(f"Recorded at {found['recorded']}: every process on this install patches the verified seams; run "
              "selftest again after `hermes update`")
    else:
        print(f"NOT recorded: {found.get('record_error')}")
