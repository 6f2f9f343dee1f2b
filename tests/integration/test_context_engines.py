"""The contract with a third-party context engine selected (``context.engine`` in
config.yaml, the engine registered by a directory plugin through
``ctx.register_context_engine``), for the three test engines of ``tests/engines``:

* ``trimmed-compressor``: Hermes's compressor with one step changed;
* ``digest-engine``: written from scratch, summaries in its own format (no Hermes marker);
* ``ledger-engine``: keeps its own store per session id (the hermes-lcm pattern).

Every release from 0.13.0 selects engines this way. Each engine runs once per
release in its own Hermes process (``engine_driver.py``: Hermes's plugin discovery
is per process and registers one engine); the tests read what it saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.host.engines import HOLDS, NOT_HELD, PARTLY, report_for_home
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from tests.engines import ENGINES, install

from .conftest import requires_host

DRIVER = Path(__file__).with_name("engine_driver.py")
SID = "20260701_090000_e0e0e0"
REPO = Path(__file__).resolve().parents[2]

pytestmark = requires_host


def _drive(home: Path, llm: FakeLLMServer, engine: str, *, guard: bool = True) -> dict[str, Any]:
    # The host is configured to rotate (0.18.2+ would keep the id on its own otherwise).
    probe.write_config(home, llm.base_url, in_place=False, plugin_enabled=guard)
    install(home, engine)
    out = home / "result.json"
    env = {k: v for k, v in __import__("os").environ.items() if k != "HERMES_SESSION_ID"}
    env["HERMES_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, str(DRIVER), "--home", str(home), "--base-url", llm.base_url, "--out", str(out)]
    proc = subprocess.run([*cmd, *([] if guard else ["--without-guard"])], env=env, capture_output=True, text=True,
                          timeout=300)
    assert out.exists(), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert "error" not in result, result["error"]
    return result


@pytest.fixture(scope="module", params=list(ENGINES))
def run(request: pytest.FixtureRequest, llm: FakeLLMServer,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    engine = request.param
    home = tmp_path_factory.mktemp(f"engine-{engine}")
    llm.reset()
    llm.configure(strict=True, reply_text="engine test ok")  # a provider that refuses unknown message keys
    try:
        yield engine, home, _drive(home, llm, engine)
    finally:
        llm.reset()


def test_the_engine_is_the_active_one(run: tuple[str, Path, dict[str, Any]]) -> None:
    engine, _, r = run
    assert r["guard_loaded"] and r["engine_name"] == engine
    assert r["engine_class"] != "ContextCompressor"


def test_session_id_unchanged(run: tuple[str, Path, dict[str, Any]]) -> None:
    _, _, r = run
    assert r["session_id_after"] == r["late_session_id"] == r["session_id_after_turn"] == SID
    assert r["sessions"] == [SID]  # no child session was created
    assert r["messages_after"] < 48


def test_snapshot_verbatim(run: tuple[str, Path, dict[str, Any]]) -> None:
    _, _, r = run
    assert len(r["snapshots"]) == 1 and r["snapshots"][0].startswith(f"{SID}.snapshot.")
    assert r["snapshot_verbatim"]


def test_one_compression_per_session(run: tuple[str, Path, dict[str, Any]]) -> None:
    """A second agent with the pre-compression list adopts the compaction instead of
    running the engine again."""
    _, _, r = run
    assert r["compress_calls"] == 1
    assert r["late_messages"] == r["messages_after"]


def test_messages_are_buffered_while_the_engine_runs(run: tuple[str, Path, dict[str, Any]]) -> None:
    """While the engine compresses, the session is registered as compressing: what the
    gateway's busy-message seam asks before it buffers a message."""
    _, _, r = run
    assert len(r["compressing_during"]) == 1 and r["compressing_during"][0]


def test_messages_buffered_through_the_gateway(run: tuple[str, Path, dict[str, Any]]) -> None:
    """Through the real GatewayRunner with the engine selected: a follow-up that arrives
    while the engine compresses is buffered, then answered after the trigger, same id."""
    engine, _, r = run
    (check,) = r["gateway"]["checks"]
    assert check["ok"], check["detail"]
    assert r["gateway"]["engine_runs"], "the gateway's compression did not go through the engine"
    boundaries = [c for c in r["gateway"]["callbacks"] if c.get("boundary_reason") == "compression"]
    assert boundaries and all(c["session_id"] == c["old_session_id"] for c in boundaries)


def test_engine_state_still_found(run: tuple[str, Path, dict[str, Any]]) -> None:
    engine, _, r = run
    starts = [c for c in r["callbacks"] if c["callback"] == "on_session_start"]
    assert starts and {c["session_id"] for c in starts} == {SID}
    assert any(c.get("boundary_reason") == "compression" and c.get("old_session_id") == SID for c in starts)
    # Never a reset, and no callback names another id. (on_session_end with the same id
    # comes from commit_memory_session, which Hermes's own in-place compaction calls too.)
    assert not [c for c in r["callbacks"] if c["callback"] == "on_session_reset"]
    assert {c["session_id"] for c in r["callbacks"]} == {SID}
    if engine != "trimmed-compressor":
        assert r["engine_session_id"] == SID
    if engine == "ledger-engine":
        assert r["ledger_files"] == [f"{SID}.json"] and r["ledger_entries"] > 0


def test_summary_tagged_and_hidden(run: tuple[str, Path, dict[str, Any]]) -> None:
    engine, _, r = run
    assert len(r["tagged_positions"]) == 1, r["tagged_texts"]
    if engine == "trimmed-compressor":
        assert "trimmed-compressor" in r["tagged_texts"][0] and f"session {SID}, turns" in r["tagged_texts"][0]
    # Reloaded from state.db (CLI resume, gateway, TUI, ACP): tagged again, and hidden.
    assert r["loaded_tagged_texts"] == r["tagged_texts"]
    if engine == "trimmed-compressor":  # Hermes's format: may be merged into a kept turn, which stays
        assert not any("CONTEXT COMPACTION" in t or "trimmed-compressor" in t for t in r["shown_texts"])
    else:  # the engine's own message, hidden whole
        assert r["shown_count"] == r["loaded_count"] - 1
        assert not any(t.startswith(("DIGEST of", "<<ledger")) for t in r["shown_texts"])
    assert r["next_turn_answer"] == "engine test ok"  # the strict provider never saw the tag


def test_recall_over_the_snapshot(run: tuple[str, Path, dict[str, Any]]) -> None:
    _, _, r = run
    assert "turn-20:" in r["recall"]


def test_promises_reported_for_the_engine(run: tuple[str, Path, dict[str, Any]]) -> None:
    engine, home, r = run
    states = {p["key"]: p["state"] for p in r["support"]["promises"]}
    if engine == "trimmed-compressor":
        assert set(states.values()) == {HOLDS}
    else:
        assert states["recall_line"] == NOT_HELD and states["summary_failure"] == PARTLY
        assert states["summaries_tagged"] == states["engine_state"] == states["id_stable"] == HOLDS
    if engine == "digest-engine":  # what selftest prints, from the home's config.yaml, in its own process
        report = report_for_home(home)
        assert report["configured"] == engine and report["found"] and report["engine_class"] == "DigestEngine"
        assert {p["key"]: p["state"] for p in report["promises"]} == states


def test_without_the_guard_a_rotation_loses_the_engine_state(llm: FakeLLMServer, tmp_path: Path) -> None:
    """Hermes as shipped, configured to rotate: the ledger engine is re-bound to the new
    id, and the conversation's folded messages are no longer under the id it continues with."""
    r = _drive(tmp_path / "home", llm, "ledger-engine", guard=False)
    new_id = r["session_id_after"]
    assert new_id != SID and r["engine_session_id"] == new_id
    assert r["ledger_entries_by_id"].get(SID, 0) > 0 and r["ledger_entries_by_id"].get(new_id, 0) == 0


def test_selftest_names_the_engine_and_what_does_not_hold(home: Path, llm: FakeLLMServer) -> None:
    install(home, "digest-engine")
    env = {k: v for k, v in __import__("os").environ.items() if k != "HERMES_SESSION_ID"}
    env["HERMES_HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-m", "hermes_session_guard.commands.cli", "selftest"], env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert "Context engine 'digest-engine' (class DigestEngine, own):" in out, out[-3000:]
    assert "[HOLDS] session id unchanged across compression" in out
    assert "[DOES NOT HOLD] recall line ([Original context: ...]) inside the summary" in out
    assert "[PARTLY] a failed or empty summary is refused" in out
    assert "context engine 'digest-engine': 2 promise(s) do not fully hold" in out.splitlines()[-1]


def test_an_engine_the_guard_cannot_wrap_is_left_alone_and_reported(guard: Any, db: Any, llm: FakeLLMServer,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """An engine whose ``compress`` is replaced on the instance (here: by a plain
    closure, as another wrapper would) is not wrapped: one WARNING names it and what
    does not hold; the id, the snapshot and the lock still hold, its summary stays untagged."""
    import logging

    from hermes_session_guard.host.engines import assess
    from tests.engines.digest_engine import DigestEngine

    messages = probe.seed_messages()
    sid = "20260701_100000_f0f0f0"
    probe.seed_session(db, sid, messages)
    agent = probe.make_agent(db, llm.base_url, sid)
    probe.mark_flushed(agent, messages)
    engine = DigestEngine()
    engine.update_model(model="fake-model", context_length=128_000)
    own_compress = engine.compress
    engine.compress = lambda msgs, **kwargs: own_compress(msgs, **kwargs)  # type: ignore[method-assign]
    agent.context_compressor = engine
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        compressed, _ = agent._compress_context(list(messages), "You are a test agent.", approx_tokens=150_000)
    assert agent.session_id == sid and len(compressed) < len(messages)
    assert len(guard.store_for(Path(db.db_path)).list_snapshots(sid)) == 1
    assert not any(m.get("is_compressed_summary") for m in compressed)
    warned = [r.getMessage() for r in caplog.records if "'digest-engine'" in r.getMessage()]
    assert len(warned) == 1 and "replaced on the engine instance" in warned[0] and "NOT held" in warned[0]
    support = assess(engine)
    assert not support.wrappable
    not_held = {p.key for p in support.promises if p.state != HOLDS}
    assert not_held == {"summaries_tagged", "summary_failure", "recall_line"}


def test_the_engine_names_the_guard_uses_exist_in_this_hermes(guard: Any) -> None:
    """The interface and selection names in host_names.HOST_NAMES resolve on this release."""
    import importlib

    from agent.context_engine import ContextEngine

    from .host_names import HOST_NAMES

    missing = [n for n in HOST_NAMES["ContextEngine interface"] if not hasattr(ContextEngine, n)]
    for dotted in HOST_NAMES["context engine selection (engine_support, selftest)"]:
        if dotted.startswith("config.yaml"):
            continue
        module, _, attr = dotted.rpartition(".")
        if getattr(importlib.import_module(module), attr, None) is None:
            missing.append(dotted)
    assert missing == []


@pytest.mark.parametrize("engine_class", ["CopyTrimmingEngine", "InPlaceTrimmingEngine", "SummaryFirstEngine"])
def test_an_engine_that_edits_or_reorders_what_it_keeps_never_hides_a_kept_turn(guard: Any, db: Any,
                                                                               llm: FakeLLMServer,
                                                                               engine_class: str) -> None:
    """An engine that shortens the messages it keeps (copies or in place), or puts its
    summary in front of the kept head: only its own summary is tagged and hidden, never a
    kept turn. Shortened copies are known by the source the shim recorded on each input
    message (summaries.tags.SOURCE_KEY), never by their text; no record is left behind."""
    from hermes_session_guard.summaries.tags import SOURCE_KEY, SUMMARY_TAG
    from hermes_session_guard.summaries.visibility import HIDDEN, display_messages
    from tests.engines import edited_kept

    messages = probe.seed_messages()
    sid = "20260701_110000_e1e1e1"
    probe.seed_session(db, sid, messages)
    agent = probe.make_agent(db, llm.base_url, sid)
    probe.mark_flushed(agent, messages)
    engine = getattr(edited_kept, engine_class)()
    engine.update_model(model="fake-model", context_length=128_000)
    agent.context_compressor = engine
    compressed, _ = agent._compress_context(list(messages), "You are a test agent.", approx_tokens=150_000)
    assert agent.session_id == sid and len(compressed) < len(messages)
    digests = [i for i, m in enumerate(compressed) if str(m.get("content", "")).startswith("DIGEST of")]
    turns = [i for i, m in enumerate(compressed) if str(m.get("content", "")).startswith("turn-")]
    assert len(digests) == 1 and len(turns) == len(compressed) - 1 - (compressed[0].get("role") == "system")
    if engine_class != "SummaryFirstEngine":  # every kept turn was shortened
        assert all("[trimmed " in str(compressed[i]["content"]) for i in turns)
    tagged = [i for i, m in enumerate(compressed) if m.get(SUMMARY_TAG)]
    assert tagged == digests
    assert not any(SOURCE_KEY in m for m in [*messages, *compressed])

    loaded = db.get_messages_as_conversation(sid)  # what CLI resume, the gateway, TUI and ACP load
    shown = [str(m.get("content")) for m in display_messages(loaded, HIDDEN)]
    shown_turns = [t.split(":", 1)[0] for t in shown if t.startswith("turn-")]
    assert shown_turns == [str(compressed[i]["content"]).split(":", 1)[0] for i in turns]
    assert not any(t.startswith("DIGEST of") for t in shown)
    assert len(guard.store_for(Path(db.db_path)).list_snapshots(sid)) == 1
