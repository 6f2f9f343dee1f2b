"""``demo``: the bug report's two anomalies on the installed Hermes, guard off then on,
side by side. Runs in a subprocess with a temporary ``HERMES_HOME`` against the
bundled loopback fake LLM; the real home is never touched."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from .output import fail
from .selftest import run_in_temp_home

HELP = "Show anomalies A and B with the guard off and on, side by side (temporary home, fake LLM)"
MARKER = "SESSION_GUARD_DEMO "
WIDTH = 44


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--release-default", action="store_true",
                   help="run Hermes in its own default compression mode (0.18.2+ keep the id in place); "
                        "by default such a release is put in its rotating mode (compression.in_place: false)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds for the whole demo")


def run_scenarios(release_default: bool, timeout: float) -> dict[str, Any]:
    argv = ["hermes_session_guard.selftest.demo_scenarios", *(["--release-default"] if release_default else [])]
    return run_in_temp_home("demo", argv, MARKER, "the demo", timeout, GATEWAY_ALLOW_ALL_USERS="true")


def _ids(col: dict[str, Any]) -> str:
    after = col.get("ids_after") or []
    same = after == [col.get("id_before")]
    return ", ".join(after) + (" (same)" if same else " (CHANGED)")


ROWS: list[tuple[str, Any]] = [
    ("session id before", lambda c: c.get("id_before", "-")),
    ("session id after", _ids),
    ("forks (new session rows)", lambda c: c.get("forks", "-")),
    ("summary calls", lambda c: c.get("summary_calls", "-")),
    ("turns only under another id", lambda c: c.get("turns_left_behind", "-")),
    ("new messages lost", lambda c: ", ".join(c.get("messages_lost") or []) or "none"),
    ("summaries visible", lambda c: c.get("summaries_visible", "-")),
    ("replies to the chat", lambda c: ", ".join(c["replies"]) if "replies" in c else None),
    ("host log lines", lambda c: c.get("host_log") or ["none"]),
    ("verdict", lambda c: "clean" if c.get("clean") else f"{len(c.get('problems') or [])} problem(s)"),
    ("seconds", lambda c: c.get("seconds", "-")),
]


def _cell(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        out += textwrap.wrap(str(item), WIDTH - 2, break_long_words=True) or [""]
    return out


def print_table(report: dict[str, Any]) -> None:
    mode = report.get("mode")
    mode_text = ("Hermes's own default mode: compaction in place, the id is kept" if mode == "in_place"
                 else "rotating compaction: a new session id per compression")
    print(f"Hermes {report.get('hermes_version')}: both anomalies of the bug report, guard off then on "
          f"({mode_text}); temporary homes, loopback fake LLM, {report.get('seconds')} s")
    for s in report.get("scenarios", []):
        print()
        print(f"Anomaly {s['name']}: {s['title']}")
        print(f"  {'':<30}{'guard off':<{WIDTH}}guard on")
        print(f"  {'-' * 28}  {'-' * (WIDTH - 2)}  {'-' * (WIDTH - 2)}")
        for label, get in ROWS:
            off, on = get(s["off"]), get(s["on"])
            if off is None and on is None:
                continue
            left, right = _cell(off), _cell(on)
            for i in range(max(len(left), len(right))):
                name = label if i == 0 else ""
                a = left[i] if i < len(left) else ""
                b = right[i] if i < len(right) else ""
                print(f"  {name:<30}{a:<{WIDTH}}{b}")
        for side in ("off", "on"):
            for problem in s[side].get("problems") or []:
                print(f"  guard {side}: {problem}")
        if s["name"] == "A" and not s["off"].get("forks") and s["off"].get("ids_after") == [s["off"].get("id_before")]:
            print("  (this Hermes keeps the id itself in this mode: the guard-off column shows what remains; "
                  "run without --release-default to see a rotating release)")
    print()
    clean = all(s["on"].get("clean") for s in report.get("scenarios", []))
    print("demo: guard on " + ("CLEAN in every scenario" if clean else "NOT clean (see the problems above)"))


def run(args: argparse.Namespace) -> int:
    report = run_scenarios(args.release_default, args.timeout)
    if report.get("error"):
        extra = {k: v for k, v in report.items() if k in ("stderr", "traceback")}
        return fail(f"demo failed: {report['error']}", args.json, **extra)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_table(report)
    return 0 if report.get("ok") else 1
