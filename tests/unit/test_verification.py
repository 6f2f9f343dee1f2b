"""Verification per install (seams/verification.py): the code fingerprint, the record, the plan a
process follows on a release outside the table, and what selftest makes of the probe."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.seam_behaviour import Effect
from hermes_session_guard.seams import table
from hermes_session_guard.seams import verification as v

ROOT = Path(__file__).resolve().parents[2]

_PRINT = ("import sys; from hermes_session_guard.seams import verification as v; "
          "v.fingerprinted_modules = lambda: ['fakehermes_state', 'fakeagent.compression', 'fakegone']; "
          "print(v.fingerprint('0.23.5'))")


def _fake_hermes(root: Path) -> Path:
    (root / "fakeagent").mkdir(parents=True)
    (root / "fakeagent" / "__init__.py").write_text("", encoding="utf-8")
    (root / "fakeagent" / "compression.py").write_text("def compress_context(agent, messages, system_message):\n"
                                                       "    return messages\n", encoding="utf-8")
    (root / "fakehermes_state.py").write_text("class SessionDB:\n    def archive_and_compact(self, sid, rows):\n"
                                              "        return 1\n", encoding="utf-8")
    return root


def _fingerprint(code_dir: Path, home: Path, seed: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code_dir), str(ROOT)]), HERMES_HOME=str(home),
               PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", _PRINT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_fingerprint_is_stable_across_processes_and_homes(tmp_path: Path) -> None:
    code = _fake_hermes(tmp_path / "site")
    first = _fingerprint(code, tmp_path / "home-a", "1")
    assert len(first) == 64
    assert _fingerprint(code, tmp_path / "home-b", "2") == first
    assert _fingerprint(code, tmp_path / "home-a", "3") == first


def test_the_fingerprint_changes_when_a_patched_target_s_code_changes(tmp_path: Path) -> None:
    code = _fake_hermes(tmp_path / "site")
    before = _fingerprint(code, tmp_path / "home", "0")
    target = code / "fakeagent" / "compression.py"
    target.write_text(target.read_text().replace("system_message)", "system_message, *, reason=None)"),
                      encoding="utf-8")  # a trailing keyword parameter
    added = _fingerprint(code, tmp_path / "home", "0")
    assert added != before
    state = code / "fakehermes_state.py"
    state.write_text(state.read_text().replace("return 1", "return 0"), encoding="utf-8")  # same signature
    assert _fingerprint(code, tmp_path / "home", "0") not in (before, added)
    (code / "fakegone.py").write_text("x = 1\n", encoding="utf-8")  # a module that was absent appears
    assert len({before, added, _fingerprint(code, tmp_path / "home", "0")}) == 3


def test_the_fingerprint_names_the_hermes_version() -> None:
    assert v.fingerprint("0.23.5") != v.fingerprint("0.23.6")


def test_every_seam_that_changes_behaviour_has_one_promise_or_is_left_off() -> None:
    changing = {row.seam for row in table.SEAMS if row.effect is Effect.CHANGES}
    promised = v.checked_seams()
    assert len(promised) == len(set(promised))
    assert not set(promised) & set(v.UNCHECKED)
    assert changing == set(promised) | set(v.UNCHECKED)
    assert v.PROMISES[0].name == v.COMPACTION == "compaction"


@pytest.fixture()
def record_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "env" / v.RECORD_NAME
    path.parent.mkdir()
    monkeypatch.setattr(v, "record_path", lambda: path)
    monkeypatch.setattr(v, "fingerprint", lambda version: f"fp-{version}")
    monkeypatch.delenv(v.TRIAL_ENV, raising=False)
    return path


def _record(**changes: Any) -> dict[str, Any]:
    return {"hermes_version": "0.23.5", "fingerprint": "fp-0.23.5", "verified_at": "2026-12-07T21:00:00Z",
            "rows": {"compression": ">=0.20.0,<0.23.0"}, **changes}


def test_the_record_is_readable_by_others_and_never_world_writable(record_at: Path) -> None:
    assert v.write_record(_record(), record_at) == record_at
    assert stat.S_IMODE(record_at.stat().st_mode) == 0o644
    assert v.read_record(record_at) == _record()


def test_the_record_replaces_a_link_at_its_name_and_never_follows_it(record_at: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("keep", encoding="utf-8")
    record_at.symlink_to(elsewhere)
    assert v.read_record(record_at) is None  # a link is not read
    v.write_record(_record(), record_at)
    assert elsewhere.read_text(encoding="utf-8") == "keep" and not record_at.is_symlink()


def test_a_linked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError):
        v.write_record(_record(), tmp_path / "link" / v.RECORD_NAME)
    assert not (real / v.RECORD_NAME).exists()


def test_a_read_only_environment_raises_and_writes_nothing(record_at: Path) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    record_at.parent.chmod(0o555)
    try:
        with pytest.raises(PermissionError):
            v.write_record(_record(), record_at)
    finally:
        record_at.parent.chmod(0o755)
    assert not record_at.exists()


def test_a_matching_record_is_followed_and_any_other_is_not(record_at: Path) -> None:
    assert v.plan_for("0.23.5").mode == v.UNVERIFIED  # no record yet
    assert "no verification recorded" in v.plan_for("0.23.5").problem
    v.write_record(_record(), record_at)
    plan = v.plan_for("0.23.5")
    assert plan.mode == v.VERIFIED and plan.rows == {"compression": ">=0.20.0,<0.23.0"}
    rows, reason = plan.candidates("compression") or ([], "")
    assert [r.range_text for r in rows] == [">=0.20.0,<0.23.0"]
    assert reason == "verified on this install by selftest at 2026-12-07T21:00:00Z"
    assert plan.candidates("turn_order") is None  # not verified: stays off
    other = v.plan_for("0.23.6")  # hermes update: other code
    assert other.mode == v.UNVERIFIED and "made for other Hermes code" in other.problem
    v.write_record(_record(fingerprint="fp-edited"), record_at)
    assert v.plan_for("0.23.5").mode == v.UNVERIFIED
    v.write_record(_record(rows={}), record_at)
    assert "verified no promise" in v.plan_for("0.23.5").problem


def test_trial_mode_needs_the_probe_s_own_temporary_home(record_at: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv(v.TRIAL_ENV, str(home))
    assert v.plan_for("0.23.5").mode == v.UNVERIFIED  # a user's home is never a trial
    probe_home = tmp_path / f"{v.TRIAL_HOME_PREFIX}x1"
    monkeypatch.setenv("HERMES_HOME", str(probe_home))
    assert v.plan_for("0.23.5").mode == v.UNVERIFIED  # the variable must name this very home
    monkeypatch.setenv(v.TRIAL_ENV, str(probe_home))
    assert v.plan_for("0.23.5").mode == v.TRIAL


def _probe(failing: tuple[str, ...] = (), seam_states: dict[str, str] | None = None) -> dict[str, Any]:
    checks = [{"name": "compression seam patched", "ok": "compression seam patched" not in failing}]
    for promise in v.PROMISES:
        checks += [{"name": f"{part} check", "part": part, "ok": part not in failing, "detail": "x"}
                   for part in promise.parts]
    states = seam_states or {}
    seams = [{"name": s, "state": states.get(s, "patched"), "row": ">=0.20.0,<0.23.0", "reason": "r"}
             for s in v.checked_seams()]
    return {"checks": checks, "seams": seams, "host_version": "0.23.5", "fingerprint": "fp"}


def test_each_promise_is_verified_by_its_checks_and_seams() -> None:
    results = {r.name: r for r in v.evaluate(_probe())}
    assert all(r.verified for r in results.values())
    record = v.record_for(_probe(), list(results.values()))
    assert record["promises"] == [p.name for p in v.PROMISES]
    assert set(record["rows"]) == set(v.checked_seams()) and record["fingerprint"] == "fp"

    results = {r.name: r for r in v.evaluate(_probe(failing=("buffered delivery",)))}
    assert results["compaction"].verified and not results["buffered delivery"].verified
    assert "buffered delivery check: x" in results["buffered delivery"].why

    results = {r.name: r for r in v.evaluate(_probe(seam_states={"buffer_drain": "skipped"}))}
    assert not results["buffered delivery"].verified and "buffer_drain skipped" in results["buffered delivery"].why
    record = v.record_for(_probe(), list(results.values()))
    assert "buffer_drain" not in record["rows"] and "compression" in record["rows"]

    results = {r.name: r for r in v.evaluate(_probe(failing=("lock",)))}
    assert not any(r.verified for r in results.values())  # nothing stands without the compaction
    assert results["summary tags"].why == "needs compaction"


def test_a_probe_that_never_ran_verifies_nothing() -> None:
    (first, *_) = v.evaluate({"error": "live probe timed out after 180s"})
    assert not first.verified and "timed out" in first.why
    assert json.dumps(v.record_for({}, v.evaluate({})))  # serialisable as it stands
