"""engine_support without Hermes: which engine shapes the guard can wrap, which
messages a compaction produced, and the promises reported per engine."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.host import engines as es


class OwnEngine:
    name = "own"

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None) -> list[dict[str, Any]]:
        return [messages[0], {"role": "assistant", "content": "FOLDED"}, messages[-1]]


class AsyncEngine:
    name = "async-engine"

    async def compress(self, messages: list[Any]) -> list[Any]:
        return messages


class KeywordOnlyEngine:
    name = "kw-engine"

    def compress(self, *, messages: list[Any]) -> list[Any]:
        return messages


class NoCompress:
    name = "none"


def _messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)]


def test_a_plain_compress_method_can_be_wrapped() -> None:
    assert es.compress_shape(OwnEngine()) is None


@pytest.mark.parametrize(("engine", "why"), [
    (AsyncEngine(), "async"),
    (KeywordOnlyEngine(), "keyword-only"),
    (NoCompress(), "no compress method"),
])
def test_other_shapes_are_refused_with_the_reason(engine: Any, why: str) -> None:
    assert why in (es.compress_shape(engine) or "")


def test_compress_replaced_on_the_instance_by_something_else_is_refused() -> None:
    engine = OwnEngine()
    engine.compress = lambda messages, **_: messages  # type: ignore[method-assign]
    assert "replaced on the engine instance" in (es.compress_shape(engine) or "")


def test_produced_positions_are_what_lies_between_the_kept_head_and_tail() -> None:
    before = _messages(10)
    after = [*before[:3], {"role": "assistant", "content": "anything at all"}, *before[-2:]]
    assert es.produced_positions(before, after) == [3]
    # a tool result or a tool-call turn the engine rewrote is never a summary
    after = [*before[:3], {"role": "tool", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{}]},
             {"role": "user", "content": "S"}, *before[-2:]]
    assert es.produced_positions(before, after) == [5]
    assert es.produced_positions(before, list(before)) == []


def test_kept_messages_an_engine_edited_or_moved_are_never_taken_for_its_summary() -> None:
    before = _messages(10)
    note = {"role": "assistant", "content": "note"}
    copies = [{**m, "content": "short"} for m in before[-3:]]
    assert es.produced_positions(before, [*before[:3], note, *copies]) == []  # copies: unclear, nothing
    assert es.produced_positions(before, [*before[:3], note, *copies[:2], before[-1]]) == []
    in_place = before[-3:]
    for m in in_place:
        m["content"] = "short"  # the very objects it was given
    assert es.produced_positions(before, [*before[:3], note, *in_place]) == [3]
    assert es.produced_positions(before, [before[0], note, *before[1:3], *before[-2:]]) == [1]  # summary first
    one_copy = [*before[:5], {**before[5], "content": "short"}, *before[6:]]  # nothing folded, one rewritten
    assert es.produced_positions(before, one_copy) == []
    assert es.produced_positions(before, [*before[:3], note, {"role": "user", "content": "more"},
                                          *before[-2:]]) == []  # a summary in two parts


def test_an_empty_produced_message_is_a_failed_summary() -> None:
    before = _messages(10)
    after = [*before[:2], {"role": "assistant", "content": "  "}, *before[-2:]]
    assert "empty summary" in (es.empty_summary(OwnEngine(), before, after) or "")
    assert es.empty_summary(OwnEngine(), before, OwnEngine().compress(before)) is None


def test_assess_an_own_engine() -> None:
    states = {p.key: p.state for p in es.assess(OwnEngine()).promises}
    assert states["recall_line"] == es.NOT_HELD and states["summary_failure"] == es.PARTLY
    assert states["summaries_tagged"] == states["id_stable"] == states["engine_state"] == es.HOLDS


def test_assess_an_engine_that_cannot_be_wrapped() -> None:
    support = es.assess(AsyncEngine())
    assert not support.wrappable and "async" in support.reason
    not_held = {p.key for p in support.promises if p.state != es.HOLDS}
    assert not_held == {"summaries_tagged", "summary_failure", "recall_line"}
    assert all(p.state == es.HOLDS for p in support.promises if p.key in ("id_stable", "snapshot", "recall"))


def test_assess_the_builtin_and_an_unpatched_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert es.assess(None).all_hold
    from hermes_session_guard.commands import selftest

    own = {"configured": "own", "found": True, **es.assess(OwnEngine(), name="own").as_dict()}
    monkeypatch.setattr(es, "report_for_home", lambda home, timeout: own)
    report = selftest.context_engine_report(Path("."), {"seams": []}, 1.0)  # selftest: no compression seam patched
    assert not report["all_hold"] and all(p["state"] == es.NOT_HELD for p in report["promises"])


def test_the_shim_leaves_an_unwrappable_engine_alone_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    class Agent:
        context_compressor = KeywordOnlyEngine()

    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        host.shim_engine(Agent())
        host.shim_engine(Agent())
    assert "compress" not in vars(Agent.context_compressor)
    lines = [r.getMessage() for r in caplog.records if "kw-engine" in r.getMessage()]
    assert len(lines) == 1 and "NOT held" in lines[0] and "keyword-only" in lines[0]


def test_the_shim_wraps_an_own_engine_and_refuses_its_empty_summary() -> None:
    class Empty(OwnEngine):
        def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None) -> list[Any]:
            return [messages[0], {"role": "assistant", "content": ""}, messages[-1]]

    class Agent:
        context_compressor = Empty()

    before = _messages(10)
    with host.watching_engine(Agent()) as verdict:
        out = Agent.context_compressor.compress(before)
    host.unshim_engines()
    assert out == before and "empty summary" in (verdict.failure or "")


def test_a_list_found_stale_under_the_host_lease_gets_no_summary_call() -> None:
    """Native mode: asked once the host called its engine; a stale list returns the input
    unchanged ("no progress") without calling the engine, a current one is compacted."""
    calls: list[int] = []

    class Counting(OwnEngine):
        def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None) -> list[Any]:
            calls.append(len(messages))
            return super().compress(messages, current_tokens)

    class Agent:
        context_compressor = Counting()

    before = _messages(10)
    try:
        with host.watching_engine(Agent(), stale=lambda: True) as verdict:
            out = Agent.context_compressor.compress(before)
        assert out == before and verdict.found_stale and calls == [] and verdict.failure is None
        with host.watching_engine(Agent(), stale=lambda: False) as verdict:
            out = Agent.context_compressor.compress(before)
        assert len(out) == 3 and not verdict.found_stale and calls == [10]
    finally:
        host.unshim_engines()


def test_configured_engine_reads_context_engine(tmp_path: Path) -> None:
    assert es.configured_engine(tmp_path) == "compressor"
    (tmp_path / "config.yaml").write_text("context:\n  engine: lcm\n", encoding="utf-8")
    assert es.configured_engine(tmp_path) == "lcm"
    report = es.report_for_home(tmp_path / "nowhere")
    assert report["configured"] == "compressor" and report["all_hold"]


def test_print_report_names_the_engine_and_each_state() -> None:
    lines: list[str] = []
    es.print_report({"configured": "own", "found": True, **es.assess(OwnEngine(), name="own").as_dict()}, lines.append)
    text = "\n".join(lines)
    assert "Context engine 'own' (class OwnEngine, own):" in text
    assert "[DOES NOT HOLD] recall line" in text and "Not every promise holds" in text


def test_the_builtin_engine_is_one_line() -> None:
    lines: list[str] = []
    es.print_report({"configured": "compressor", "found": True, "builtin": True}, lines.append)
    assert lines == ["Context engine 'compressor' (Hermes's built-in): the live probe above checks the contract "
                     "with it"]


def test_an_enabled_handoff_is_a_new_id_the_engine_must_carry_over(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("session_guard:\n  handoff:\n    enabled: true\n", encoding="utf-8")
    assert es.handoff_enabled(tmp_path)
    states = {p.key: (p.state, p.detail) for p in es.assess(OwnEngine(), handoff=True).promises}
    assert states["engine_state"][0] == es.PARTLY and "boundary_reason='handoff'" in states["engine_state"][1]
    assert es.assess(OwnEngine()).promises[4].state == es.HOLDS
    assert not es.handoff_enabled(tmp_path / "none")
