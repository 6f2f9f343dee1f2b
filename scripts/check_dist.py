#!/usr/bin/env python3
"""Build the sdist and the wheel, check what they hold, and run the installed wheel.

    python3 scripts/check_dist.py                    # Hermes 0.19.0 in the throw-away venv
    python3 scripts/check_dist.py --hermes 0.14.0    # another release
    python3 scripts/check_dist.py --no-install       # build and inspect only

1. ``python -m build`` (sdist, then the wheel from the sdist) in a build venv kept
   at ``.venvs/build``; any deprecation or setuptools warning in its output fails.
2. The wheel holds only the package (every module of the checkout's package),
   ``py.typed``, the package data the code reads at run time, and the dist-info
   (LICENSE under ``licenses/``, the README as the long description); its
   metadata carries the SPDX license expression, classifiers, project URLs and the
   ``hermes`` extra. The sdist holds the package, README, LICENSE and pyproject.
3. A fresh venv in a temporary directory outside the checkout gets the wheel and
   ``hermes-agent==<release>``; from there (no PYTHONPATH, cwd outside the
   checkout) ``hermes-session-guard enable`` protects an empty HERMES_HOME and
   ``hermes-session-guard selftest`` checks it, and the recall eval
   (``scripts/eval_recall.py`` copied out of the checkout) runs on the fixture
   that ships inside the package.

Exit status 0 when every step passed; one line per check is printed.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hermes_session_guard"
BUILD_VENV = ROOT / ".venvs" / "build"
DEFAULT_HERMES = "0.19.0"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matrix import packages_for  # noqa: E402  (the one map of releases to what pip installs)

# A warning of this kind in the build output fails the check.
BAD_BUILD_OUTPUT = re.compile(r"deprecat|SetuptoolsWarning|UserWarning", re.IGNORECASE)
# Files the package reads at run time besides its modules (kept in sync with package-data).
PACKAGE_DATA = {f"{PACKAGE}/py.typed", f"{PACKAGE}/selftest/data/recall_conversation.json",
                f"{PACKAGE}/handoff/rules/credsweeper.yaml", f"{PACKAGE}/handoff/rules/LICENSE.credsweeper",
                f"{PACKAGE}/dashboard_page/index.js"}
DIST_INFO_FILES = {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt", "licenses/LICENSE"}
SDIST_TOP = {"PKG-INFO", "README.md", "LICENSE", "pyproject.toml", "setup.cfg"}


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}" + (f"  ({detail})" if detail and not ok else ""), flush=True)
        if not ok:
            self.failed.append(name)
        return ok


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # type: ignore[call-overload]
                          **kw)


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_script(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


def build_python() -> Path:
    py = venv_python(BUILD_VENV)
    if not (BUILD_VENV / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(BUILD_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "build"], check=True)
        (BUILD_VENV / ".installed").write_text("build")
    return py


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HERMES_HOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def expected_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts}


def check_build(checks: Checks, out: Path) -> tuple[Path, Path] | None:
    proc = run([str(build_python()), "-m", "build", "--outdir", str(out), str(ROOT)], env=clean_env())
    bad = [line for line in proc.stdout.splitlines() if BAD_BUILD_OUTPUT.search(line)]
    checks.check("sdist and wheel build", proc.returncode == 0, proc.stdout[-2000:])
    checks.check("no deprecation or setuptools warning while building", not bad, "; ".join(bad[:5]))
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    if proc.returncode != 0 or len(wheels) != 1 or len(sdists) != 1:
        return None
    return wheels[0], sdists[0]


def _unexpected(names: Iterable[str], allowed: set[str]) -> list[str]:
    return sorted(set(names) - allowed)


def check_wheel(checks: Checks, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        metadata = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    modules = expected_modules()
    allowed = modules | PACKAGE_DATA | {f"{dist_info}/{n}" for n in DIST_INFO_FILES}
    checks.check("wheel holds only the package, py.typed, package data, LICENSE and metadata",
                 not _unexpected(names, allowed), ", ".join(_unexpected(names, allowed)[:10]))
    missing = sorted((modules | PACKAGE_DATA | {f"{dist_info}/licenses/LICENSE"}) - set(names))
    checks.check("wheel holds every module of the package, py.typed, the recall fixture and LICENSE",
                 not missing, ", ".join(missing[:10]))
    checks.check("license metadata is an SPDX expression with its file",
                 metadata.get("License-Expression") == "MIT" and "LICENSE" in metadata.get_all("License-File", [])
                 and not metadata.get("License"), f"{metadata.get('License-Expression')!r}")
    checks.check("classifiers and project URLs present",
                 bool(metadata.get_all("Classifier")) and bool(metadata.get_all("Project-URL"))
                 and not any(c.startswith("License ::") for c in metadata.get_all("Classifier", [])))
    checks.check("README is the long description", metadata.get("Description-Content-Type") == "text/markdown"
                 and "hermes-session-guard" in (metadata.get_payload() or ""))
    requires = metadata.get_all("Requires-Dist", [])
    hermes = [r for r in requires if r.startswith("hermes-agent")]
    checks.check("Hermes is an optional extra, never a plain dependency",
                 "hermes" in metadata.get_all("Provides-Extra", []) and bool(hermes)
                 and all('extra == "hermes"' in r for r in hermes), "; ".join(hermes))


def check_sdist(checks: Checks, sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name]
    egg_info = {n for n in names if n.startswith(f"{PACKAGE}.egg-info/")}
    allowed = expected_modules() | PACKAGE_DATA | SDIST_TOP | egg_info
    checks.check("sdist holds the package, README, LICENSE and pyproject",
                 not _unexpected(names, allowed) and {"README.md", "LICENSE", "pyproject.toml"} <= set(names),
                 ", ".join(_unexpected(names, allowed)[:10]))


def check_installed(checks: Checks, wheel: Path, hermes: str, keep: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="session-guard-dist-"))
    try:
        venv = tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv_python(venv)
        started = time.monotonic()
        packages = packages_for(hermes)  # hermes-agent==X, or the repackaging of a release after 0.19.0
        proc = run([str(py), "-m", "pip", "install", "-q", *packages, str(wheel)], cwd=tmp, env=clean_env())
        if not checks.check(f"wheel and {' '.join(packages)} install into a fresh venv "
                            f"({time.monotonic() - started:.0f}s)", proc.returncode == 0, proc.stdout[-2000:]):
            return
        env = clean_env(HERMES_HOME=str(tmp / "home"))
        (tmp / "home").mkdir()
        where = run([str(py), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=tmp, env=env)
        location = where.stdout.strip().splitlines()[-1] if where.stdout.strip() else ""
        checks.check("the guard imports from the venv, not the checkout",
                     where.returncode == 0 and Path(location).is_relative_to(venv), location)
        pip_check = run([str(py), "-m", "pip", "check"], cwd=tmp, env=env)
        checks.check("pip check", pip_check.returncode == 0, pip_check.stdout.strip())
        # The home is protected the way the README says (`enable`), then checked: selftest
        # fails on a home where the guard is not enabled.
        enable = run([str(venv_script(venv, "hermes-session-guard")), "enable"], cwd=tmp, env=env)
        checks.check("hermes-session-guard enable from the installed wheel", enable.returncode == 0,
                     enable.stdout.strip()[-300:])
        # a generous probe timeout: CI shares its cores, and a loaded machine is not a failure
        selftest = run([str(venv_script(venv, "hermes-session-guard")), "selftest", "--timeout", "300"],
                       cwd=tmp, env=env)
        print(selftest.stdout, flush=True)
        checks.check("hermes-session-guard selftest from the installed wheel", selftest.returncode == 0,
                     selftest.stdout.strip().splitlines()[-1] if selftest.stdout.strip() else "no output")
        script = tmp / "eval_recall.py"
        shutil.copy2(ROOT / "scripts" / "eval_recall.py", script)
        recall = run([str(py), str(script)], cwd=tmp, env=clean_env())
        print(recall.stdout, flush=True)
        checks.check("recall eval from the installed wheel (fixture shipped in the package)",
                     recall.returncode == 0, recall.stdout.strip()[-300:])
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hermes", default=DEFAULT_HERMES, help="hermes-agent release for the installed check")
    parser.add_argument("--no-install", action="store_true", help="build and inspect only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    started = time.monotonic()
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="session-guard-build-") as out:
        built = check_build(checks, Path(out))
        if built is not None:
            wheel, sdist = built
            check_wheel(checks, wheel)
            check_sdist(checks, sdist)
            if not args.no_install:
                check_installed(checks, wheel, args.hermes, args.keep)
    ok = not checks.failed
    print(f"dist check: {'PASSED' if ok else 'FAILED: ' + ', '.join(checks.failed)} "
          f"({time.monotonic() - started:.0f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
