"""The contract function against a stand-in host (no Hermes): id kept, snapshot
stored verbatim, persistence through the SessionDB API, audit events, failures."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from hermes_session_guard import audit
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression

SUMMARY = "[CONTEXT COMPACTION — REFERENCE ONLY] earlier turns\n## Goal\nship it"


class Engine:
    def __init__(self, fail: str | None = None, empty: bool = False) -> None:
        self.fail = fail
        self.empty = empty
        self._last_summary_error: str | None = None

    def compress(self, messages: list[dict], current_tokens: int | None = None) -> list[dict]:
        self._last_summary_error = self.fail
        body = "[CONTEXT COMPACTION — REFERENCE ONLY]" if self.empty else SUMMARY
        return [messages[0], {"role": "assistant", "content": body}, messages[-1]]


class Agent:
    def __init__(self, db: Any, engine: Engine, sid: str = "S1") -> None:
        self.session_id = sid
        self._session_db = db
        self.context_compressor = engine
        self._last_flushed_db_idx = 10
        self.rotate_on_compress = True
        self.in_place_write_fails = False

    def _compress_context(self, messages: list[dict], system_message: str) -> tuple[list[dict], str]:
        compressed = self.context_compressor.compress(messages)
        if self._session_db is not None and getattr(self, "compression_in_place", False):
            # what 0.18.2+ does: archive in place, then say it reached state.db
            self._last_compaction_in_place = not self.in_place_write_fails
        elif self._session_db is not None and self.rotate_on_compress:  # what 0.14 does when it can
            self.session_id = "S2-rotated"
        return compressed, "new prompt"


def _messages(n: int = 10) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]


@freeze_time("2026-05-28 16:15:40.123456")
def test_detach_strategy_keeps_id_and_persists_under_it(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    messages = _messages()
    out, prompt = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                      lambda: agent._compress_context(messages, "sys"))
    assert agent.session_id == "S1"
    assert agent._session_db is db  # put back after the host ran detached
    db.replace_messages.assert_called_once_with("S1", out)
    db.update_system_prompt.assert_called_once_with("S1", "new prompt")
    assert agent._last_flushed_db_idx == len(out) == 3
    store = runtime.store_for(db.db_path)
    (snap,) = store.list_snapshots("S1")
    assert snap.snapshot_id == "S1.snapshot.20260528T161540.123456Z"
    assert store.snapshot_messages(snap.snapshot_id) == messages
    events = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
    assert [e["event"] for e in events] == ["compression.started", "compression.done"]
    assert {e["session_id"] for e in events} == {"S1"} and len({e["op_id"] for e in events}) == 1
    assert events[-1]["session_id_after"] == "S1" and events[-1]["messages_after"] == 3


@freeze_time("2026-05-28 16:15:40")
def test_snapshot_ids_stay_unique_under_a_frozen_clock(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    for _ in range(2):
        messages = _messages()
        guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                            lambda m=messages: agent._compress_context(m, "s"))
    ids = [s.snapshot_id for s in runtime.store_for(db.db_path).list_snapshots("S1")]
    assert ids == ["S1.snapshot.20260528T161540.000000Z", "S1.snapshot.20260528T161540.000000Z-2"]


@pytest.mark.parametrize("engine", [Engine(fail="HTTP 500"), Engine(empty=True)])
@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_failed_summary_changes_nothing(runtime: Runtime, db: Any, engine: Engine, strategy: str) -> None:
    agent = Agent(db, engine)
    agent.rotate_on_compress = False
    messages = _messages()
    original = [dict(m) for m in messages]
    out, _ = guarded_compression(runtime, strategy, agent, messages, lambda: agent._compress_context(messages, "s"))
    assert out is messages and out == original
    db.replace_messages.assert_not_called()
    assert runtime.store_for(db.db_path).list_snapshots("S1") == []
    last = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert last["event"] == "compression.failed" and last["reason"]


def test_host_exception_propagates_and_is_audited(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())

    def boom() -> Any:
        raise RuntimeError("summary timeout")

    with pytest.raises(RuntimeError):
        guarded_compression(runtime, Strategy.DETACH_DB, agent, _messages(), boom)
    assert agent._session_db is db
    last = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert last["event"] == "compression.failed" and "summary timeout" in last["reason"]


def test_persistence_failure_fails_closed(runtime: Runtime, db: Any) -> None:
    db.replace_messages.side_effect = OSError("disk full")
    agent = Agent(db, Engine())
    messages = _messages()
    out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                 lambda: agent._compress_context(messages, "s"))
    assert out is messages and len(out) == 10
    assert agent.session_id == "S1"
    last = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert last["event"] == "compression.failed" and "disk full" in last["reason"]


def test_in_place_strategy_forces_host_flag_and_restores_it(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    agent.compression_in_place = False
    seen: list[bool] = []

    def host() -> Any:
        seen.append(agent.compression_in_place)
        return agent._compress_context(messages, "s")

    messages = _messages()
    guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages, host)
    assert seen == [True] and agent.compression_in_place is False
    db.replace_messages.assert_not_called()  # the host persists in place itself
    assert len(runtime.store_for(db.db_path).list_snapshots("S1")) == 1


def test_without_a_session_id_the_host_runs_untouched(runtime: Runtime, db: Any) -> None:
    agent = Agent(db, Engine(), sid="")
    messages = _messages()
    guarded_compression(runtime, Strategy.DETACH_DB, agent, messages, lambda: agent._compress_context(messages, "s"))
    assert agent.session_id == "S2-rotated"
    assert not runtime.audit_path.exists()

def test_transcript_metadata_rows_are_not_carried_over(runtime: Runtime, db: Any) -> None:
    """Hermes's gateway stores a ``session_meta`` row in the transcript and drops it before
    handing history to an agent: it is not a turn another agent appended, so it never comes
    back after the compacted block. A real turn appended meanwhile does."""
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    messages = _messages()
    late = {"role": "user", "content": "written by another agent meanwhile"}
    db.get_messages_as_conversation.return_value = [
        {"role": "session_meta", "content": None, "tools": []}, *[dict(m) for m in messages], late,
    ]
    out, _ = guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages,
                                 lambda: agent._compress_context(messages, "s"))
    assert [m["role"] for m in out].count("session_meta") == 0
    assert out[-1] == late and len(out) == 4
    (call,) = db.append_message.call_args_list
    assert call.kwargs["role"] == "user" and call.kwargs["content"] == late["content"]
    done = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert done["event"] == "compression.done" and done["carried_over"] == 1


class _Row(dict):
    """A transcript row that can be watched for being freed (a plain dict cannot)."""


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_the_live_read_is_freed_before_the_host_runs(runtime: Runtime, db: Any, strategy: str) -> None:
    """The generation check's read of the live transcript is a second copy of every text;
    it must not be held through the summary call (13 sessions compressing at once would
    hold 13 copies). A turn carried over after the compacted block stays."""
    import gc
    import weakref

    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    messages = _messages()
    late = {"role": "user", "content": "written by another agent meanwhile"}
    watched: list[weakref.ref] = []

    def live(*_args: Any, **_kwargs: Any) -> list[dict]:
        rows = [_Row(m) for m in [*messages, late]]
        watched.extend(weakref.ref(r) for r in rows)
        return rows

    db.get_messages_as_conversation.side_effect = live
    alive_while_host_ran: list[int] = []

    def host() -> tuple[list[dict], str]:
        gc.collect()
        alive_while_host_ran.append(sum(ref() is not None for ref in watched))
        return agent._compress_context(messages, "s")

    out, _ = guarded_compression(runtime, strategy, agent, messages, host)
    # read twice: before the summary call, and again right before the compacted transcript
    # replaces the live one (what other writers stored during the summary call stays)
    assert len(watched) == 2 * (len(messages) + 1)
    assert alive_while_host_ran == [1]  # only the carried-over turn
    assert out[-1] == late and out.count(late) == 1


def test_an_adopted_transcript_is_recorded_like_a_compaction(runtime: Runtime, db: Any) -> None:
    """A second agent whose list predates the compaction adopts the live transcript; the
    list it continues with is recorded for the 0.14 gateway's transcript re-basing."""
    agent = Agent(db, Engine())
    messages = _messages()
    out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                 lambda: agent._compress_context(messages, "s"))
    db.get_messages_as_conversation.return_value = [dict(m) for m in out]
    late = {"role": "user", "content": "a question the other agent got meanwhile"}
    stale = [*[dict(m) for m in messages], late]
    other = Agent(db, Engine())
    mark = runtime.compactions.mark()
    calls: list[int] = []
    adopted, _ = guarded_compression(runtime, Strategy.DETACH_DB, other, stale,
                                     lambda: calls.append(1) or other._compress_context(stale, "s"))
    assert calls == [] and adopted == [*out, late]
    assert [e["event"] for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1] == "compression.adopted"
    compaction = runtime.compactions.since("S1", mark)
    assert compaction is not None and list(compaction.compacted) == adopted

def test_the_after_compression_hook_runs_once_the_lock_is_released(runtime: Runtime, db: Any) -> None:
    from hermes_session_guard.hooks.manager import get_plugin_manager
    from hermes_session_guard.hooks.specs import hookimpl

    seen: list[tuple[Any, ...]] = []
    store = runtime.store_for(db.db_path)

    class Watcher:
        @hookimpl
        def session_guard_after_compression(self, session_id: str, compressed: list[Any], agent: Any) -> None:
            seen.append((session_id, len(compressed), agent, runtime.locks_for(db.db_path).held_sessions(),
                         store.lease_holder(session_id)))

    agent = Agent(db, Engine())
    messages = _messages()
    pm = get_plugin_manager()
    plugin = Watcher()
    pm.register(plugin, name="test-after-compression-watcher")
    try:
        out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                     lambda: agent._compress_context(messages, "s"))
    finally:
        pm.unregister(plugin)
    assert seen == [("S1", len(out), agent, [], None)]


def test_extensions_name_the_snapshot_and_hear_of_an_adopted_transcript(runtime: Runtime, db: Any) -> None:
    """``session_guard_snapshot_id`` (first answer wins over the built-in one, which runs
    last), ``session_guard_before_compression``, ``session_guard_transcript_adopted`` and
    ``session_guard_compression_failed`` reach an installed extension."""
    from hermes_session_guard.hooks.manager import get_plugin_manager
    from hermes_session_guard.hooks.specs import hookimpl

    adopted_seen: list[tuple[str, int, int]] = []
    before_seen: list[tuple[str, int]] = []
    failed_seen: list[tuple[str, str]] = []

    class Extension:
        @hookimpl
        def session_guard_before_compression(self, session_id: str, messages: list[Any]) -> None:
            before_seen.append((session_id, len(messages)))

        @hookimpl
        def session_guard_compression_failed(self, session_id: str, reason: str) -> None:
            failed_seen.append((session_id, reason))

        @hookimpl
        def session_guard_snapshot_id(self, session_id: str, created_at: float) -> str:
            return f"{session_id}.snapshot.custom"

        @hookimpl
        def session_guard_transcript_adopted(self, session_id: str, generation: int, adopted: list[Any]) -> None:
            adopted_seen.append((session_id, generation, len(adopted)))

    pm = get_plugin_manager()
    plugin = Extension()
    pm.register(plugin, name="test-snapshot-and-adoption")
    try:
        agent = Agent(db, Engine())
        messages = _messages()
        out, _ = guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                                     lambda: agent._compress_context(messages, "s"))
        db.get_messages_as_conversation.return_value = [dict(m) for m in out]
        stale = [*[dict(m) for m in messages], {"role": "user", "content": "late"}]
        other = Agent(db, Engine())
        adopted, _ = guarded_compression(runtime, Strategy.DETACH_DB, other, stale,
                                         lambda: other._compress_context(stale, "s"))

        def boom() -> Any:
            raise RuntimeError("summary timeout")

        third = Agent(db, Engine())
        with pytest.raises(RuntimeError):
            guarded_compression(runtime, Strategy.DETACH_DB, third, [*[dict(m) for m in adopted], *_messages()], boom)
    finally:
        pm.unregister(plugin)
    (snap,) = runtime.store_for(db.db_path).list_snapshots("S1")
    assert snap.snapshot_id == "S1.snapshot.custom"
    assert adopted_seen == [("S1", 1, len(adopted))]
    assert before_seen[0] == ("S1", len(messages))
    assert len(failed_seen) == 1 and failed_seen[0][0] == "S1" and "summary timeout" in failed_seen[0][1]


def _shape(messages: list[dict]) -> list[str]:
    return ["summary" if m["content"].startswith("[CONTEXT COMPACTION") else m["content"] for m in messages]


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_questions_other_agents_persisted_meanwhile_go_before_the_turn_in_progress(
    runtime: Runtime, db: Any, strategy: str
) -> None:
    """Hermes 0.17 and 0.18.2 persist a user message before its preflight compression: a
    question another agent of the session got meanwhile is live when this agent compresses
    its own turn in progress. State.db keeps the arrival order; the list this agent goes on
    with ends with its own question (which it is answering), and a stale contender that
    adopts gets its own question last too. Other turns' questions still waiting for their
    answers stay out of those lists: next to the agent's own question, Hermes would fold
    the two user messages into one prompt."""
    agent = Agent(db, Engine())
    agent.rotate_on_compress = False
    mine = [*_messages(9)]  # ends with this agent's question m8
    other_q = {"role": "user", "content": "a question the other agent got meanwhile"}
    db.get_messages_as_conversation.return_value = [*[dict(m) for m in mine], other_q]
    out, _ = guarded_compression(runtime, strategy, agent, mine, lambda: agent._compress_context(mine, "s"))
    assert _shape(out) == ["m0", "summary", "m8"]
    if strategy == Strategy.DETACH_DB:
        (call,) = db.replace_messages.call_args_list
        assert _shape(call.args[1]) == ["m0", "summary", "m8", other_q["content"]]
    else:
        (call,) = db.append_message.call_args_list
        assert call.kwargs["content"] == other_q["content"]
    record = runtime.store_for(db.db_path).generation("S1")
    assert record is not None and record.block_len == 2  # both lists start with the block

    # the other agent, whose list predates the compaction, adopts; a third agent's question
    # arrived after its own: its own question still ends the list it goes on with
    third_q = {"role": "user", "content": "a third agent's question"}
    db.get_messages_as_conversation.return_value = [
        {"role": "user", "content": "m0"}, {"role": "assistant", "content": SUMMARY},
        {"role": "user", "content": "m8"}, dict(other_q), third_q,
    ]
    other = Agent(db, Engine())
    stale = [*[dict(m) for m in mine[:8]], dict(other_q)]
    adopted, _ = guarded_compression(runtime, strategy, other, stale, lambda: other._compress_context(stale, "s"))
    assert _shape(adopted) == ["m0", "summary", other_q["content"]]
    assert [e["event"] for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1] == "compression.adopted"
class InPlaceAgent(Agent):
    """0.18.2+'s in-place path: the engine's result is written live right after it returns."""

    def _compress_context(self, messages: list[dict], system_message: str) -> tuple[list[dict], str]:
        compressed = self.context_compressor.compress(messages)
        self._session_db.archive_and_compact(self.session_id, compressed)
        self._last_compaction_in_place = True  # set once the write committed, as 0.19 does
        return compressed, "new prompt"


def test_in_place_snapshot_is_stored_before_the_host_writes_the_live_transcript(runtime: Runtime, db: Any) -> None:
    """Write-ahead: a process killed between the two writes keeps the history in the snapshot."""
    store = runtime.store_for(db.db_path)
    seen: list[list[Any]] = []
    db.archive_and_compact.side_effect = lambda sid, rows: seen.append(store.list_snapshots(sid))
    agent = InPlaceAgent(db, Engine())
    messages = _messages()
    out, _ = guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages,
                                 lambda: agent._compress_context(messages, "s"))
    assert len(out) == 3 and agent.session_id == "S1"
    ((snap,),) = seen  # already stored when the host wrote the compacted rows
    assert store.list_snapshots("S1") == [snap] and store.snapshot_messages(snap.snapshot_id) == messages
    done = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert done["event"] == "compression.done" and done["snapshot_id"] == snap.snapshot_id


def test_a_host_failing_after_its_summary_keeps_the_snapshot_written_ahead(runtime: Runtime, db: Any) -> None:
    db.archive_and_compact.side_effect = OSError("disk I/O error")
    agent = InPlaceAgent(db, Engine())
    messages = _messages()
    with pytest.raises(OSError):
        guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages,
                            lambda: agent._compress_context(messages, "s"))
    (snap,) = runtime.store_for(db.db_path).list_snapshots("S1")
    assert runtime.store_for(db.db_path).snapshot_messages(snap.snapshot_id) == messages
    failed = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")][-1]
    assert failed["event"] == "compression.failed" and failed["snapshot_written_ahead"] == snap.snapshot_id


def test_a_snapshot_that_cannot_be_written_ahead_is_written_after_the_host(
    runtime: Runtime, db: Any, mocker: Any
) -> None:
    store = runtime.store_for(db.db_path)
    original = store.write_snapshot
    calls: list[str] = []

    def flaky(**kwargs: Any) -> Any:
        calls.append("ahead" if not calls else "after")
        if len(calls) == 1:
            raise OSError("database is locked")
        return original(**kwargs)

    mocker.patch.object(store, "write_snapshot", side_effect=flaky)
    agent = InPlaceAgent(db, Engine())
    messages = _messages()
    guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages,
                        lambda: agent._compress_context(messages, "s"))
    assert calls == ["ahead", "after"]
    (snap,) = store.list_snapshots("S1")
    events = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
    assert [e["event"] for e in events] == ["compression.started", "snapshot.deferred", "compression.done"]
    assert events[-1]["snapshot_id"] == snap.snapshot_id


def test_no_snapshot_is_written_ahead_of_an_engine_that_made_no_progress(runtime: Runtime, db: Any) -> None:
    class Idle(Engine):
        def compress(self, messages: list[dict], current_tokens: int | None = None) -> list[dict]:
            return [dict(m) for m in messages]  # an equal copy: Hermes treats it as no progress

    agent = InPlaceAgent(db, Idle())
    messages = _messages()
    out, _ = guarded_compression(runtime, Strategy.HOST_IN_PLACE, agent, messages,
                                 lambda: (agent.context_compressor.compress(messages), "s"))
    assert out == _messages()
    assert runtime.store_for(db.db_path).list_snapshots("S1") == []
