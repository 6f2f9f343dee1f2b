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

from ..hostinfo import install_path, installed_version

HELP = "Check the installed Hermes: seams patched and the session-id contract, live"
MARKER = "SESSION_GUARD_PROBE "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the live probe")


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
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER):])
        return {"ok": False, "error": "live probe printed no result", "stderr": proc.stderr[-4000:],
                "checks": [], "seams": []}


def run(args: argparse.Namespace) -> int:
    version = installed_version()
    report: dict[str, Any] = {"hermes_version": version, "hermes_path": install_path()}
    if version is None:
        report.update(ok=False, error="hermes-agent is not installed in this Python environment "
                      f"({sys.executable}); install the guard into the environment Hermes runs from")
        probe: dict[str, Any] = {"checks": [], "seams": []}
    else:
        probe = run_probe(args.timeout)
        report.update(ok=bool(probe.get("ok")), seams=probe.get("seams", []), checks=probe.get("checks", []))
        if probe.get("error"):
            report["error"] = probe["error"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Hermes {version or 'not installed'} at {report.get('hermes_path') or '-'}")
        print("Seams:")
        for s in report.get("seams", []):
            print(f"  {s['name']:<15} {s['state']:<10} {s['target']}  {s['reason']}")
        print("Contract (live probe, temporary HERMES_HOME, loopback fake LLM):")
        for c in report.get("checks", []):
            detail = f"  ({c['detail']})" if c["detail"] and not c["ok"] else ""
            print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['name']}{detail}")
        if report.get("error"):
            print(f"error: {report['error']}")
            if probe.get("traceback"):
                print(probe["traceback"])
            if probe.get("stderr"):
                print(probe["stderr"])
        print("selftest: " + ("PASSED" if report["ok"] else "FAILED"))
    return 0 if report["ok"] else 1
