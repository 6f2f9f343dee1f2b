"""The selftest's "summary tagged and stripped from the request" check passes with the
guard and fails when the tag reaches a strict provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import new_agent

SID = "20260601_110000_dddddd"


def _compacted(db: Any, llm: FakeLLMServer) -> tuple[Any, list]:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    return agent, compressed


def test_check_passes_with_the_guard(guard: Any, db: Any, llm: FakeLLMServer, home: Path) -> None:
    agent, compressed = _compacted(db, llm)
    result = probe.ProbeResult()
    assert probe.summary_tag_check(result, llm, agent, compressed, SID), result.checks


def test_check_fails_when_the_tag_reaches_the_wire(guard: Any, db: Any, llm: FakeLLMServer, home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    agent, compressed = _compacted(db, llm)
    wire = instrumentation._applied["wire"]
    monkeypatch.setattr(wire.parent, wire.name, wire.original)  # the provider copy keeps the tag
    result = probe.ProbeResult()
    assert not probe.summary_tag_check(result, llm, agent, compressed, SID)
    assert "is_compressed_summary" in result.checks[-1]["detail"]
