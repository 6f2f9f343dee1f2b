"""``selftest`` says plainly when the installed Hermes is not a tested release."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from hermes_session_guard.commands import selftest

NOTE = ("Hermes 0.20.0 is not a tested release (tested: 0.13.0, 0.19.0); a seam is patched only where its "
        "target verifies by signature. Patched: none. Skipped: compression (target not found).")


def _payload(ok: bool, in_table: bool) -> dict[str, Any]:
    return {
        "ok": ok,
        "host_version": "0.20.0",
        "host_in_table": in_table,
        "compat_note": "" if in_table else NOTE,
        "seams": [{"name": "compression", "target": "-", "state": "skipped", "reason": "target not found",
                   "failure_policy": "", "row": ""}],
        "checks": [{"name": "compression seam patched", "ok": ok, "detail": ""}],
    }


@pytest.fixture
def fake_probe(mocker: Any) -> Any:
    mocker.patch.object(selftest, "installed_version", return_value="0.20.0")
    mocker.patch.object(selftest, "install_path", return_value="/site-packages")
    return mocker.patch.object(selftest, "run_probe")


def test_untested_release_is_reported_in_plain_words(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=False, in_table=False)
    code = selftest.run(argparse.Namespace(json=False, timeout=5.0))
    out = capsys.readouterr().out
    assert code == 1
    assert f"UNTESTED RELEASE: {NOTE}" in out
    assert "compression          skipped     -  target not found" in out
    assert out.rstrip().endswith("selftest: FAILED")


def test_untested_release_in_json(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=True, in_table=False)
    assert selftest.run(argparse.Namespace(json=True, timeout=5.0)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host_in_table"] is False and report["compat_note"] == NOTE


def test_tested_release_prints_no_note(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=True, in_table=True)
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 0
    assert "UNTESTED" not in capsys.readouterr().out
