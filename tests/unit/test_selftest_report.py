"""``selftest`` says plainly when the installed Hermes is not a tested release."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import selftest
from hermes_session_guard.hostinfo import FOUND_BY_DISTRIBUTION, HostRelease

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
def fake_probe(mocker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    mocker.patch.object(selftest, "find_host", return_value=HostRelease("0.20.0", FOUND_BY_DISTRIBUTION,
                                                                         "/site-packages"))
    return mocker.patch.object(selftest, "run_probe")


def test_untested_release_is_reported_in_plain_words(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=False, in_table=False)
    code = selftest.run(argparse.Namespace(json=False, timeout=5.0))
    out = capsys.readouterr().out
    assert code == 1
    assert f"UNTESTED RELEASE: {NOTE}" in out
    assert "compression          skipped     -  target not found" in out
    assert out.rstrip().endswith("selftest: FAILED")


@pytest.mark.parametrize("config", [None, "model: x\n", "plugins:\n  enabled: [other]\n",
                                    "plugins:\n  enabled: [session-guard]\n  disabled: [session-guard]\n"])
def test_a_home_without_the_guard_enabled_is_not_protected(
    fake_probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    config: str | None,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if config is not None:
        (home / "config.yaml").write_text(config, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    fake_probe.return_value = _payload(ok=True, in_table=True)
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 1
    out = capsys.readouterr().out
    assert f"HERMES_HOME {home}: NOT PROTECTED" in out
    assert "selftest: FAILED: the live probe passed, but" in out and "PASSED" not in out
    assert fake_probe.called  # the live probe still runs and reports
    assert selftest.run(argparse.Namespace(json=True, timeout=5.0)) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["probe_ok"] is True and report["home"]["guard_enabled"] is False
    assert "NOT protected" in report["error"]


def test_no_hermes_home_at_all_runs_the_probe_only(fake_probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HERMES_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "user").mkdir()
    fake_probe.return_value = _payload(ok=True, in_table=True)
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 0
    out = capsys.readouterr().out
    assert "Your Hermes home: none (no Hermes home at" in out and "its own temporary home" in out
    assert out.rstrip().endswith("selftest: PASSED (live probe only; there is no Hermes home on this machine "
                                 "to protect yet)")
    assert not (tmp_path / "user" / ".hermes").exists()
    fake_probe.return_value = _payload(ok=False, in_table=True)
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 1


def test_an_explicit_hermes_home_that_does_not_exist_is_an_error(
    fake_probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "nope"))
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 2
    assert "does not exist" in capsys.readouterr().err and not fake_probe.called


def test_untested_release_in_json(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=True, in_table=False)
    assert selftest.run(argparse.Namespace(json=True, timeout=5.0)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["host_in_table"] is False and report["compat_note"] == NOTE


def test_tested_release_prints_no_note(fake_probe: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_probe.return_value = _payload(ok=True, in_table=True)
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 0
    assert "UNTESTED" not in capsys.readouterr().out


def _trial_payload(failing: tuple[str, ...] = ()) -> dict[str, Any]:
    from hermes_session_guard.seams import verification

    checks = [{"name": "compression seam patched", "ok": True, "detail": ""}]
    for promise in verification.PROMISES:
        checks += [{"name": part, "part": part, "ok": part not in failing, "detail": "why not"}
                   for part in promise.parts]
    seams = [{"name": s, "target": "m:a", "state": "patched", "reason": "trial", "failure_policy": "open",
              "row": ">=0.20.0,<0.23.0"} for s in verification.checked_seams()]
    return {**_payload(False, False), "host_version": "0.23.5", "checks": checks, "seams": seams,
            "fingerprint": "f" * 64, "capabilities": "in_place"}


def test_a_release_outside_the_table_is_verified_and_recorded_for_the_install(
    fake_probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_session_guard.seams import verification

    record = tmp_path / "env" / verification.RECORD_NAME
    record.parent.mkdir()
    monkeypatch.setattr(verification, "record_path", lambda: record)
    fake_probe.return_value = _trial_payload(failing=("buffered delivery",))
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 0
    out = capsys.readouterr().out
    assert "[VERIFIED] compaction: " in out and "[VERIFIED] summary tags: " in out
    assert "[NOT VERIFIED] buffered delivery: buffered delivery: why not" in out
    assert f"Recorded at {record}" in out and "selftest: PASSED" in out
    saved = json.loads(record.read_text(encoding="utf-8"))
    assert saved["promises"] == ["compaction", "summary tags"] and "busy_message" not in saved["rows"]
    assert saved["fingerprint"] == "f" * 64 and saved["rows"]["compression"] == ">=0.20.0,<0.23.0"

    fake_probe.return_value = _trial_payload(failing=("lock",))  # compaction itself not verified: exit 1
    assert selftest.run(argparse.Namespace(json=True, timeout=5.0)) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"].startswith("compaction is NOT verified on this install: ")
    assert json.loads(record.read_text(encoding="utf-8"))["rows"] == {}  # the earlier record no longer holds


def test_an_unwritable_record_fails_selftest_and_says_where(
    fake_probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_session_guard.seams import verification

    monkeypatch.setattr(verification, "record_path", lambda: tmp_path / "missing-dir" / verification.RECORD_NAME)
    fake_probe.return_value = _trial_payload()
    assert selftest.run(argparse.Namespace(json=False, timeout=5.0)) == 1
    out = capsys.readouterr().out
    assert "NOT recorded: " in out and "run selftest as the user that owns" in out
