#!/usr/bin/env python3
"""Run the test suite against real Hermes releases, each in its own virtualenv.

    python scripts/matrix.py                    # the default releases (CI's set)
    python scripts/matrix.py 0.14.0 0.19.0      # named releases
    CI_FULL_MATRIX=1 python scripts/matrix.py   # every supported release

Each release gets ``.venvs/hermes-<version>`` with ``hermes-agent==<version>`` from
the package index and this package (editable, with its test extras). Unit tests
run once; host tests run per release. Prints a release x suite table and exits
non-zero if anything failed or no test ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venvs"
DEFAULT_RELEASES = ["0.14.0", "0.19.0"]
ALL_RELEASES = ["0.13.0", "0.14.0", "0.15.2", "0.16.0", "0.17.0", "0.18.2", "0.19.0"]


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, **kw)  # type: ignore[call-overload]


def venv_for(version: str) -> Path:
    venv = VENVS / f"hermes-{version}"
    py = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        if not py.exists():
            sh([sys.executable, "-m", "venv", str(venv)], check=True)
        sh([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        sh([str(py), "-m", "pip", "install", "-q", f"hermes-agent=={version}", "-e", f"{ROOT}[test]"], check=True)
        stamp.write_text(version)
    else:
        sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    return py


def run_pytest(py: Path, paths: list[str], extra: list[str]) -> tuple[int, dict[str, int], float]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths, *extra],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    sys.stdout.write(proc.stdout)
    counts: dict[str, int] = {}
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", tail[0]):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(n)
    return proc.returncode, counts, time.monotonic() - started


def main(argv: list[str]) -> int:
    extra = [a for a in argv if a.startswith("-")]
    releases = [a for a in argv if not a.startswith("-")]
    if not releases:
        releases = ALL_RELEASES if os.environ.get("CI_FULL_MATRIX") == "1" else DEFAULT_RELEASES
    rows: list[tuple[str, str, int, dict[str, int], float]] = []
    for i, version in enumerate(releases):
        py = venv_for(version)
        if i == 0:
            rc, counts, secs = run_pytest(py, ["tests/unit"], extra)
            rows.append(("-", "unit", rc, counts, secs))
            lint = sh([str(py), "-m", "ruff", "check", "hermes_session_guard", "tests", "scripts"], cwd=ROOT)
            rows.append(("-", "ruff", lint.returncode, {}, 0.0))
        rc, counts, secs = run_pytest(py, ["tests/integration"], extra)
        rows.append((version, "host", rc, counts, secs))
    print("\nrelease   suite  result  passed failed skipped  seconds")
    ok = True
    total_passed = total_failed = 0
    for version, suite, rc, counts, secs in rows:
        passed, failed = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0)
        total_passed += passed
        total_failed += failed
        good = rc == 0 and (suite == "ruff" or passed > 0)
        ok &= good
        print(f"{version:<9} {suite:<6} {'ok' if good else 'FAIL':<7} {passed:>6} {failed:>6} "
              f"{counts.get('skipped', 0):>7} {secs:>8.1f}")
    print(f"\n{total_passed} passed, {total_failed} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
