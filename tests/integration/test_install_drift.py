"""Hermes changed the way upstream changes releases, on the real 0.20.1 and 0.22.2 installs
(drift_host.py makes each changed host in the test's tmp dir): (a) the version string only;
(b) a trailing keyword parameter added to a patched target; (c) a patched target moved to
another module, its old name re-exported; (d) a patched target renamed throughout Hermes;
(e) a behaviour change behind an unchanged signature (the commit refuses rows written by code
outside Hermes).

For each: before ``selftest`` only the read-only and display seams are patched, with one
warning that says to run selftest; selftest verifies, per promise, what still holds and leaves
the rest off; afterwards a guarded compaction is never worse than an unguarded one (id kept,
live rows, summary), and keeps every verified promise (snapshot, tagged summary).

(a) is also the reproduction of the report "0.22.2 relabelled 0.23.5: selftest says UNTESTED
RELEASE and exits 1, no snapshot, no tagged summary".
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe

from . import drift_host as d
from .conftest import HERMES_VERSION, HOST_NATIVE_MODE

pytestmark = [pytest.mark.host,
              pytest.mark.skipif(not HOST_NATIVE_MODE, reason="drift cases are made from the native-mode releases")]

ALL = d.PROMISES
CASES = d.CASES
# 0.20.1 runs (a) and (e) in CI's default run; every case in the full matrix
_SLOW_ON_0_20 = {"b_trailing_keyword", "c_moved_and_reexported", "d_renamed_throughout"}


def _params() -> list[Any]:
    slow = HERMES_VERSION.startswith("0.20.")
    return [pytest.param(name, marks=[pytest.mark.slow] if slow and name in _SLOW_ON_0_20 else [], id=name)
            for name in CASES]


def _enabled_home(path: Path) -> Path:
    probe.write_config(path, "http://127.0.0.1:9/v1", plugin_enabled=True)
    return path


@pytest.mark.parametrize("case", _params())
def test_a_changed_release_is_protected_as_far_as_selftest_verifies(case: str, tmp_path: Path) -> None:
    edits, expected = CASES[case]
    started = time.monotonic()
    python = d.make_host(tmp_path, edits())

    before = d.compact(python, tmp_path / "before", "status")
    assert before["seams"]["compression"] == "skipped"
    (warning,) = before["warnings"]  # one line, saying what to do
    assert "not a tested release" in warning and "run it again after `hermes update`" in warning
    assert "`hermes-session-guard selftest`" in warning

    code, report, tail = d.selftest(python, _enabled_home(tmp_path / "home"))
    promises = {p["name"]: p for p in report.get("verification", {}).get("promises", [])}
    assert promises, tail
    assert tuple(name for name in ALL if promises[name]["verified"]) == expected, promises
    assert code == (0 if "compaction" in expected else 1), tail
    assert report["verification"].get("recorded") == str(tmp_path / "venv" / "hermes-session-guard-verified.json")

    guarded = d.compact(python, tmp_path / "guarded", "guarded")
    plain = d.compact(python, tmp_path / "plain", "plain")
    # never worse than Hermes alone
    for key in ("id_kept", "compacted", "rows", "returned"):
        assert guarded[key] == plain[key], (key, guarded, plain)
    assert plain["id_kept"] and plain["compacted"] and not plain["error"] and not guarded["error"]
    site = str(tmp_path / "venv")
    for run in (guarded, plain):  # the changed modules are the ones that ran
        changed = {"hermes_cli", *(path.split("/", 1)[0].removesuffix(".py") for path in edits())}
        assert all(run["origins"][name].startswith(site) for name in changed if run["origins"].get(name)), run
        assert run["origins"]["hermes_cli"].startswith(site)
    if "compaction" in expected:
        assert guarded["snapshots"] == 1 and guarded["summary"] and not guarded["warnings"]
        assert guarded["seams"]["compression"] == "patched"
    else:
        assert guarded["seams"]["compression"] == "skipped" and guarded["snapshots"] == 0
        assert len(guarded["warnings"]) == 1
    if "buffered delivery" not in expected:
        assert guarded["seams"]["busy_message"] == "skipped"  # the whole promise stays off
    print("DRIFT_MEASURE " + json.dumps({
        "release": HERMES_VERSION, "case": case, "verified": [n for n in ALL if promises[n]["verified"]],
        "not_verified": {n: promises[n]["why"][:200] for n in ALL if not promises[n]["verified"]},
        "guarded": {k: guarded[k] for k in ("id_kept", "rows", "summary", "snapshots")},
        "unguarded": {k: plain[k] for k in ("id_kept", "rows", "summary", "snapshots")},
        "seconds": round(time.monotonic() - started, 1)}))
