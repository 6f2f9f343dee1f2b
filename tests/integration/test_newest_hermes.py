"""The Hermes installer users run today (0.20+, repackaged on the index): the guard finds
it however it was installed, and installing the guard never stops compaction.

Reproduces what the 0.19 seam rows did there: holding Hermes's lock under the guard's
holder made Hermes's holder-checked commit refuse every compaction ("Compression lease
... lost before commit"), while the native-mode row lets Hermes compact in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hermes_session_guard
from hermes_session_guard.hostinfo import FOUND_BY_DISTRIBUTION, FOUND_BY_MODULE, find_host
from hermes_session_guard.seams import apply as instrumentation
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import HERMES_VERSION, HOST_NATIVE_MODE, new_agent

ROOT = Path(__file__).resolve().parents[2]
SID = "20260901_090000_n3west"
SYSTEM = "You are a test agent."

FIND = "from hermes_session_guard.hostinfo import find_host; h = find_host(); print(h.found_by, h.version)"


def _hermes_cli_version() -> str:
    import hermes_cli

    return str(hermes_cli.__version__)


def test_hermes_is_found_however_it_was_installed(tmp_path: Path) -> None:
    host = find_host()
    assert host is not None and host.version == HERMES_VERSION
    from importlib import metadata

    try:
        metadata.distribution("hermes-agent")
        assert host.found_by == FOUND_BY_DISTRIBUTION
    except metadata.PackageNotFoundError:  # a repackaging or fork: found by its hermes_cli
        assert host.found_by == FOUND_BY_MODULE and host.version == _hermes_cli_version()
        assert "no hermes-agent distribution" in host.describe()

    # the same environment with a hermes-agent distribution beside it (an installer checkout)
    alias = tmp_path / "alias"
    info = alias / f"hermes_agent-{HERMES_VERSION}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hermes-agent\nVersion: {HERMES_VERSION}\n",
                                   encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(alias), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", FIND], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [FOUND_BY_DISTRIBUTION, HERMES_VERSION], out.stderr


def _compress(db: Any, llm: FakeLLMServer, sid: str) -> tuple[Any, list[Any], list[Any]]:
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, "in_place")
    probe.mark_flushed(agent, messages)
    out, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    return agent, messages, out


@pytest.mark.skipif(not HOST_NATIVE_MODE, reason="native mode is the table's row for 0.20+ only")
def test_the_0_19_rows_stop_compaction_here_and_native_mode_does_not(
    no_guard: None, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as mp:  # the rows a 0.19 host gets, forced onto this one
        mp.setattr(instrumentation, "installed_version", lambda: "0.19.0")
        mp.setattr(instrumentation, "_reported", set())
        hermes_session_guard.install()
        try:
            agent, messages, out = _compress(db, llm, SID)
        finally:
            hermes_session_guard.uninstall()
    assert len(out) == len(messages) and agent.session_id == SID  # Hermes refused its own commit
    assert len(probe.live_messages(home / "state.db", SID)) == len(messages)

    hermes_session_guard.install()
    other = SID.replace("n3west", "n3wes2")
    agent, messages, out = _compress(db, llm, other)
    assert len(out) < len(messages) and agent.session_id == other
    assert [m["content"] for m in probe.live_messages(home / "state.db", other)] == [m["content"] for m in out]
    runtime = hermes_session_guard.current_runtime()
    assert runtime is not None and runtime.store_for(home / "state.db").list_snapshots(other)
