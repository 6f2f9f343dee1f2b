"""A compaction in a process that did not load the guard (turn isolation, a process started
before ``enable``): on a home where the guard is enabled, ``status`` and ``selftest`` say the
home is not protected, naming the session, instead of claiming protection; a compaction the
guard ran is no such finding."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.commands import selftest, status
from hermes_session_guard.maintenance.state_inspection import load_home_state
from hermes_session_guard.maintenance.turns_elsewhere import SIGNATURE
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import MODES, new_agent

SID = "20261207_120000_isolated"


def _compact(db: Any, llm: FakeLLMServer, mode: str) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, mode)
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "sys", approx_tokens=150_000)


def _selftest(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``selftest`` on this home, its live probe (a temporary home of its own) taken as passed."""
    monkeypatch.setattr(selftest, "run_probe", lambda _timeout: {"ok": True, "checks": [], "seams": []})
    monkeypatch.setattr(selftest, "context_engine_report", lambda *_a: {})
    code = selftest.run(argparse.Namespace(json=False, timeout=10.0))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("mode", MODES)
def test_an_unguarded_compaction_on_an_enabled_home_is_reported(
        no_guard: None, db: Any, llm: FakeLLMServer, home: Path, mode: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _compact(db, llm, mode)  # Hermes alone, as in a process that did not load the plugin
    found = status.build_status(load_home_state(home))["turns_elsewhere"]
    assert found["found"] and found["sessions"] == [SID] and found["unguarded_compactions"] == 1, found
    assert status.run(argparse.Namespace(json=False, session=None)) == 0
    out = capsys.readouterr().out
    assert f"[{SIGNATURE}] NOT PROTECTED" in out and SID in out
    code, out = _selftest(monkeypatch, capsys)
    assert code == 1
    assert "error: NOT PROTECTED: Hermes runs turns the guard cannot see" in out and "PASSED" not in out


def test_a_guarded_compaction_is_not_reported(guard: Any, db: Any, llm: FakeLLMServer, home: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _compact(db, llm, MODES[0])
    found = status.build_status(load_home_state(home))["turns_elsewhere"]
    assert found["checked"] and not found["found"], found
    code, out = _selftest(monkeypatch, capsys)
    assert code == 0 and "selftest: PASSED" in out, out
