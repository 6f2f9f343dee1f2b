#!/usr/bin/env python3
"""Run Hermes's own compression/session-state tests with the session guard installed.

    python scripts/hermes_suite.py                          # the Hermes installed beside this interpreter
    python scripts/hermes_suite.py --python .venvs/hermes-0.14.0/bin/python
    python scripts/hermes_suite.py --python PY --json       # one machine-readable line at the end

The sdist of every hermes-agent release carries part of Hermes's test suite. This
downloads the sdist of the release installed in ``--python``'s environment
(``pip download --no-binary :all: --no-deps``), unpacks the test files listed in
``SUITE`` that the release has, adds ``scripts/hermes_suite_conftest.py`` as their
conftest, and runs them with this checkout first on ``PYTHONPATH`` and
``hermes_session_guard.install()``. Only the tests that fail there run again without
the guard (the baseline): a test that fails with the guard and passes without it is
a new failure, one that fails both ways is the release's own. The
only acceptable ones are listed in ``EXPECTED_DIFFERENCES`` (tests that assert the
very rotation the guard removes), each with its reason, and in
docs/compatibility.md. Exit status 0 means: the guard was installed with every
seam patched, tests ran, and there was no unexpected new failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".venvs" / "hermes-suite"
CONFTEST = Path(__file__).resolve().with_name("hermes_suite_conftest.py")
MARKER = "HERMES_SUITE "

# The compression and session-state tests (whichever of them a release ships).
SUITE = (
    "test_hermes_state*.py",
    "test_cli_manual_compress.py",
    "test_lazy_session_regressions.py",
    "test_dispatch_session_id.py",
    "test_background_review_session_isolation.py",
    "test_empty_session_hygiene.py",
)

# release -> {test id: why it fails with the guard}. Only tests that assert the very
# rotation the guard removes belong here; docs/compatibility.md lists the same entries.
EXPECTED_DIFFERENCES: dict[str, dict[str, str]] = {}


@dataclass
class RunResult:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    returncode: int = 0
    seconds: float = 0.0
    output: str = ""

    @property
    def ran(self) -> int:
        return len(self.passed) + len(self.failed)


@dataclass
class SuiteReport:
    release: str
    files: list[str]
    baseline: dict[str, int]
    guarded: dict[str, int]
    new_failures: list[str]
    expected_differences: list[str]
    unexpected_new_failures: list[str]
    fixed_by_guard: list[str]
    guard_installed: bool
    guard_reapplied: int
    guarded_compressions: int
    seconds: float
    ok: bool
    error: str = ""


def host_version(python: str) -> str:
    """The Hermes release in ``python``'s environment, found as the guard finds it (the
    hermes-agent distribution, else hermes_cli.__version__)."""
    out = subprocess.run(
        [python, "-c", "from hermes_session_guard.hostinfo import installed_version as v; r = v(); "
                       "print(r) if r else exit('no hermes-agent distribution and no hermes_cli')"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    if out.returncode != 0:
        raise SystemExit(f"hermes-agent is not installed for {python}: {out.stderr.strip()}")
    return out.stdout.strip()


def sdist_for(python: str, release: str, requirement: str | None = None) -> Path:
    """The sdist of ``requirement`` (default ``hermes-agent==release``), downloaded once."""
    requirement = requirement or f"hermes-agent=={release}"
    name, _, pinned = requirement.partition("==")
    pattern = f"{name.replace('-', '[_-]')}-{pinned}.tar.gz"
    target = CACHE / "sdist"
    found = sorted(target.glob(pattern))
    if found:
        return found[0]
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [python, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", requirement, "-d", str(target)],
        check=True,
    )
    found = sorted(target.glob(pattern))
    if not found:
        raise SystemExit(f"no sdist for {requirement} in {target}")
    return found[0]


def unpack_suite(sdist: Path, release: str, workdir: Path | None = None) -> tuple[Path, list[str]]:
    """The suite's test files of this release in a fresh directory, plus our conftest."""
    workdir = workdir or CACHE / f"tests-{release}"
    if workdir.exists():
        for old in workdir.iterdir():
            if old.is_file():
                old.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 3 or parts[1] != "tests":
                continue
            name = parts[2]
            if not any(fnmatch(name, pattern) for pattern in SUITE):
                continue
            data = tar.extractfile(member)
            if data is None:
                continue
            (workdir / name).write_bytes(data.read())
            files.append(name)
    (workdir / "conftest.py").write_text(CONFTEST.read_text(encoding="utf-8"), encoding="utf-8")
    # An ini file here keeps pytest from adopting this repository's own configuration.
    (workdir / "pytest.ini").write_text("[pytest]\naddopts = -m 'not integration' -p no:cacheprovider\n",
                                        encoding="utf-8")
    return workdir, sorted(files)


def case_id(case: ET.Element) -> str:
    """``test_x.py::Class::test_name`` from a junit ``testcase`` element."""
    classname = case.get("classname", "")
    module, _, cls = classname.partition(".")
    parts = [f"{module}.py"] + ([cls.replace(".", "::")] if cls else []) + [case.get("name", "")]
    return "::".join(parts)


def run_pytest(python: str, workdir: Path, files: list[str], guarded: bool, extra: list[str]) -> RunResult:
    report = workdir / f"report-{'guarded' if guarded else 'baseline'}.xml"
    env = dict(os.environ, HERMES_SUITE_GUARD="1" if guarded else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("HERMES_HOME", None)
    started = time.monotonic()
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", f"--junitxml={report}", *files, *extra],
        cwd=workdir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    result = RunResult(returncode=proc.returncode, seconds=time.monotonic() - started, output=proc.stdout)
    if not report.exists():
        return result
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = {child.tag for child in case}
        tid = case_id(case)
        if outcome & {"failure", "error"}:
            result.failed.append(tid)
        elif "skipped" in outcome:
            result.skipped.append(tid)
        else:
            result.passed.append(tid)
    return result


def counts(run: RunResult) -> dict[str, int]:
    return {"passed": len(run.passed), "failed": len(run.failed), "skipped": len(run.skipped)}


def run_suite(python: str, release: str | None, extra: list[str], verbose: bool,
              sdist: str | None = None) -> SuiteReport:
    started = time.monotonic()
    release = release or host_version(python)
    installed = host_version(python)
    if installed.split(".")[:3] != release.split(".")[:3]:
        raise SystemExit(f"{python} has Hermes {installed}, not {release}")
    workdir, files = unpack_suite(sdist_for(python, release, sdist), release)
    if not files:
        raise SystemExit(f"the hermes-agent {release} sdist carries none of {', '.join(SUITE)}")
    guarded = run_pytest(python, workdir, files, guarded=True, extra=extra)
    # Only what failed with the guard needs a run without it (most releases: nothing).
    baseline = (run_pytest(python, workdir, guarded.failed, guarded=False, extra=extra)
                if guarded.failed else RunResult())
    if verbose:
        sys.stdout.write(baseline.output)
        sys.stdout.write(guarded.output)
    else:
        sys.stdout.write("\n".join(guarded.output.strip().splitlines()[-3:]) + "\n")
    expected = EXPECTED_DIFFERENCES.get(release, {})
    new_failures = sorted(set(guarded.failed) - set(baseline.failed))
    unexpected = [t for t in new_failures if t not in expected]
    reapplied = re.search(r"session guard: patch found missing and re-applied before (\d+) test", guarded.output)
    compressions = re.search(r"session guard: compressions through the guard: (\d+)", guarded.output)
    guard_installed = "session guard: installed on Hermes" in guarded.output and reapplied is not None
    error = ""
    if not guard_installed:
        error = "the guard was not installed for the guarded run:\n" + guarded.output[-3000:]
    elif guarded.ran == 0:
        error = "no test ran:\n" + guarded.output[-3000:]
    elif unexpected:
        error = "new failures with the guard installed: " + ", ".join(unexpected)
    return SuiteReport(
        release=release,
        files=files,
        baseline=counts(baseline),
        guarded=counts(guarded),
        new_failures=new_failures,
        expected_differences=sorted(t for t in new_failures if t in expected),
        unexpected_new_failures=unexpected,
        fixed_by_guard=sorted(set(baseline.failed) - set(guarded.failed)),
        guard_installed=guard_installed,
        guard_reapplied=int(reapplied.group(1)) if reapplied else 0,
        guarded_compressions=int(compressions.group(1)) if compressions else 0,
        seconds=round(time.monotonic() - started, 1),
        ok=not error,
        error=error,
    )


def print_report(report: SuiteReport) -> None:
    print(f"\nHermes {report.release}: {len(report.files)} test files ({', '.join(report.files)})")
    for name, c in (("with the guard", report.guarded), ("its failures, no guard", report.baseline)):
        print(f"  {name:<20} {c['passed']:>4} passed {c['failed']:>4} failed {c['skipped']:>4} skipped")
    print(f"  new failures: {len(report.new_failures)} (expected differences: {len(report.expected_differences)}, "
          f"unexpected: {len(report.unexpected_new_failures)})")
    for tid in report.expected_differences:
        print(f"    expected: {tid}: {EXPECTED_DIFFERENCES[report.release][tid]}")
    for tid in report.unexpected_new_failures:
        print(f"    UNEXPECTED: {tid}")
    print(f"  compressions that went through the guard: {report.guarded_compressions}; "
          f"patch re-applied before {report.guard_reapplied} test(s)")
    if report.error:
        print(f"  error: {report.error}")
    print(f"hermes suite {report.release}: {'ok' if report.ok else 'FAILED'} ({report.seconds:.1f}s)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", nargs="?", help="hermes-agent release (default: the one installed for --python)")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the environment Hermes is in")
    parser.add_argument("--json", action="store_true", help=f"print one '{MARKER}{{...}}' line at the end")
    parser.add_argument("-v", "--verbose", action="store_true", help="print both pytest runs in full")
    parser.add_argument("--sdist", help="the requirement whose sdist carries the tests (default hermes-agent==RELEASE)")
    args, extra = parser.parse_known_args(argv)
    # Absolute, not resolved: the tests run in another directory, and a venv's python is a symlink.
    report = run_suite(os.path.abspath(args.python), args.release, extra, args.verbose, args.sdist)
    print_report(report)
    if args.json:
        print(MARKER + json.dumps(asdict(report)))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
