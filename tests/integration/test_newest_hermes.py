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


def test_state_db_keeps_the_journal_mode_hermes_chose(guard: Any, db: Any, llm: FakeLLMServer, home: Path) -> None:
    """Hermes picks state.db's journal mode (0.20+ refuses WAL on an SQLite with the WAL-reset
    bug, as this machine's 3.40.1 is, on network filesystems, or when configured): a guarded
    compaction leaves the file in that mode."""
    import sqlite3

    def mode() -> str:
        conn = sqlite3.connect(home / "state.db")
        try:
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        finally:
            conn.close()

    chosen = mode()
    agent, messages, out = _compress(db, llm, SID.replace("n3west", "jmode1"))
    assert len(out) < len(messages) and agent.session_id == SID.replace("n3west", "jmode1")
    assert guard.store_for(home / "state.db").list_snapshots(agent.session_id)  # the guard's store wrote
    assert mode() == chosen


def _pair(home: Path, llm: FakeLLMServer, sid: str) -> tuple[list[Any], list[list[Any]]]:
    """Two agents, each on its own connection, that loaded the same 48-message session."""
    seed = probe.open_db(home / "state.db")
    try:
        probe.seed_session(seed, sid, probe.seed_messages())
    finally:
        seed.close()
    agents, lists = [], []
    for _ in range(2):
        own = probe.open_db(home / "state.db")
        loaded = own.get_messages_as_conversation(sid)
        agent = new_agent(own, llm, sid, "in_place")
        probe.mark_flushed(agent, loaded)
        agents.append(agent)
        lists.append(loaded)
    return agents, lists


def _outcome(home: Path, sid: str, agents: list[Any], before: set[str]) -> dict[str, Any]:
    live = probe.live_messages(home / "state.db", sid)
    sessions = {r["id"] for r in probe.sessions_table(home / "state.db")} - before
    return {"ids": sorted({a.session_id for a in agents}), "sessions": sorted(sessions), "live": len(live)}


def _sessions(home: Path) -> set[str]:
    return {r["id"] for r in probe.sessions_table(home / "state.db")} if (home / "state.db").exists() else set()


def _concurrent(home: Path, llm: FakeLLMServer, sid: str) -> dict[str, Any]:
    import threading

    before = _sessions(home)
    agents, lists = _pair(home, llm, sid)
    threads = [threading.Thread(target=a._compress_context, args=(m, SYSTEM), kwargs={"approx_tokens": 150_000})
               for a, m in zip(agents, lists, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return _outcome(home, sid, agents, before)


def _staggered(home: Path, llm: FakeLLMServer, sid: str) -> dict[str, Any]:
    before = _sessions(home)
    agents, lists = _pair(home, llm, sid)
    for agent, messages in zip(agents, lists, strict=True):  # the second still holds the list read before
        agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
    return {**_outcome(home, sid, agents, before), "summaries": len(llm.summary_requests())}


@pytest.mark.skipif(not HOST_NATIVE_MODE, reason="the pair scenarios of earlier releases: "
                    "test_one_compression_per_session.py")
@pytest.mark.parametrize("scenario", [_concurrent, _staggered], ids=["concurrent", "staggered"])
def test_two_agents_compact_as_they_do_without_the_guard_and_keep_the_id(
    guard: Any, llm: FakeLLMServer, home: Path, scenario: Any
) -> None:
    from .conftest import unguarded

    with unguarded():
        llm.reset()
        bare = scenario(home, llm, SID.replace("n3west", "bare01"))
    llm.reset()
    guarded = scenario(home, llm, SID.replace("n3west", "guard1"))
    sid = SID.replace("n3west", "guard1")
    assert guarded["ids"] == [sid]  # the id stays
    assert guarded["sessions"] == [sid] and len(bare["sessions"]) == 1  # no child, no fork, either way
    assert bare["live"] < 48  # Hermes compacts the pair on its own
    assert guarded["live"] < 48  # and with the guard it still does
    if "summaries" in guarded:  # a list read before the first compaction adopts it: one summary, not two
        assert guarded["summaries"] == 1 and bare["summaries"] >= 1


@pytest.mark.skipif(not HOST_NATIVE_MODE, reason="in-loop compression of earlier releases: "
                    "test_session_id_contract.py")
def test_an_in_loop_turn_compacts_as_it_does_without_the_guard(
    guard: Any, llm: FakeLLMServer, home: Path
) -> None:
    """A turn on a long session: whatever Hermes decides about compacting in the loop (0.22
    waits for a real usage report before it trusts its estimate), the guard decides the same,
    and the id stays."""
    from .conftest import unguarded

    def turn(sid: str) -> tuple[int, str]:
        db = probe.open_db(home / "state.db")
        try:
            messages = probe.seed_messages()
            probe.seed_session(db, sid, messages)
            agent = new_agent(db, llm, sid, "in_place")
            probe.mark_flushed(agent, messages)
            llm.configure(reply_text="turn answered", prompt_tokens=150_000)
            result = agent.run_conversation("and now?", conversation_history=list(messages))
            assert result.get("final_response") == "turn answered"
            agent.run_conversation("and then?", conversation_history=result.get("messages") or messages)
            return len(probe.live_messages(home / "state.db", sid)), agent.session_id
        finally:
            db.close()

    with unguarded():
        llm.reset()
        bare_live, _ = turn(SID.replace("n3west", "bare02"))
    llm.reset()
    live, sid_after = turn(SID.replace("n3west", "guard2"))
    assert sid_after == SID.replace("n3west", "guard2")
    assert (live < 48) == (bare_live < 48), (live, bare_live)
