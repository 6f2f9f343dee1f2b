"""Adoption keeps each of the caller's own messages a message of its own: appended after
the live transcript in their order, never next to another turn's unanswered prompt
(Hermes's alternation repair would fold the two user messages into one), never dropped."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_session_guard import audit
from hermes_session_guard.contract.generations import keys_of, own_turn_apart
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression

from .test_compression_contract import Agent, Engine

PREFIX = "[CONTEXT COMPACTION — REFERENCE ONLY]"


def is_summary(text: str) -> bool:
    return text.startswith(PREFIX)


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _apart(messages: list[dict[str, Any]], own: list[dict[str, Any]], start: int = 0) -> list[str]:
    out = own_turn_apart(messages, keys_of(messages), keys_of(own), is_summary, start=start)
    return [m["content"] for m in out]


def test_another_turns_unanswered_prompt_is_not_put_before_the_own_turn() -> None:
    listed = [u("h"), a(PREFIX + " s"), u("other"), u("mine")]
    assert _apart(listed, [u("mine")]) == ["h", PREFIX + " s", "mine"]


def test_answered_prompts_summaries_own_messages_and_the_block_stay() -> None:
    listed = [u(PREFIX + " s"), u("kept head"), u("other"), a("answer"), u("mine-1"), a("mine-1 answer"),
              u("mine-2")]
    own = [u("mine-1"), a("mine-1 answer"), u("mine-2")]
    assert _apart(listed, own, start=2) == [m["content"] for m in listed]


def test_several_unanswered_prompts_of_other_turns_all_stay_out_of_the_list() -> None:
    listed = [u("h"), a("block end"), u("other-0"), u("other-2"), u("mine-1")]
    assert _apart(listed, [u("mine-1")], start=2) == ["h", "block end", "mine-1"]


def _no_adjacent_users(messages: list[dict[str, Any]]) -> bool:
    return not any(x["role"] == y["role"] == "user" for x, y in zip(messages, messages[1:], strict=False))


def _compacted_by_first(runtime: Runtime, db: Any, strategy: str, history: list[dict[str, Any]],
                        prompt: dict[str, Any]) -> list[dict[str, Any]]:
    """A first agent compacts ``history`` + its ``prompt`` (the turn it is answering: the
    compacted block ends with it, not answered yet) and the live transcript is that block."""
    first = Agent(db, Engine())
    if strategy == Strategy.HOST_IN_PLACE:
        first.compression_in_place = True
    mine = [*history, prompt]
    out, _ = guarded_compression(runtime, strategy, first, mine, lambda: first._compress_context(mine, "s"))
    db.get_messages_as_conversation.return_value = [dict(m) for m in out]
    return out


@pytest.mark.parametrize("strategy", [Strategy.DETACH_DB, Strategy.HOST_IN_PLACE])
def test_a_stale_turn_adopts_with_its_prompt_apart_from_the_running_turns_prompt(
        runtime: Runtime, db: Any, strategy: str) -> None:
    history = [u("m0"), a("m1"), u("m2"), a("m3")]
    block = _compacted_by_first(runtime, db, strategy, history, u("first question"))
    assert block[-1]["content"] == "first question"  # still unanswered in the live transcript
    other = Agent(db, Engine())
    if strategy == Strategy.HOST_IN_PLACE:
        other.compression_in_place = True
    stale = [*[dict(m) for m in history], u("second question")]
    calls: list[int] = []
    adopted, _ = guarded_compression(runtime, strategy, other, stale,
                                     lambda: calls.append(1) or other._compress_context(stale, "s"))
    assert calls == []
    assert [m["content"] for m in adopted] == [*[m["content"] for m in block[:-1]], "second question"]
    assert _no_adjacent_users(adopted)
    # its own prompt reaches state.db once, after the live transcript; the other turn's stays there
    appended = [c.kwargs["content"] for c in db.append_message.call_args_list]
    assert appended == ["second question"]
    events = [e["event"] for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
    assert events[-1] == "compression.adopted"


def test_a_stale_turn_with_several_own_messages_keeps_each_in_order(runtime: Runtime, db: Any) -> None:
    history = [u("m0"), a("m1"), u("m2"), a("m3")]
    block = _compacted_by_first(runtime, db, Strategy.DETACH_DB, history, u("first question"))
    live = [*[dict(m) for m in block], a("first answer")]
    db.get_messages_as_conversation.return_value = live
    own = [u("q1"), a("r1"), u("q1"), a("r1 again"), u("q3")]  # a repeated prompt is still its own message
    stale = [*[dict(m) for m in history], *own]
    adopted, _ = guarded_compression(runtime, Strategy.DETACH_DB, Agent(db, Engine()), stale, lambda: ([], "s"))
    assert [m["content"] for m in adopted] == [m["content"] for m in [*live, *own]]
    assert _no_adjacent_users(adopted)
    assert [c.kwargs["content"] for c in db.append_message.call_args_list] == [m["content"] for m in own]


def test_an_adopting_turn_forgets_the_providers_reading_of_the_list_it_replaced(runtime: Runtime, db: Any) -> None:
    """As after Hermes's own compaction (0.19+): no stale prompt size, the one-response
    latch set, the usage anchor dropped, so 0.21+ does not floor its next estimate at the
    old reading and compact the adopted transcript again at once."""
    history = [u("m0"), a("m1"), u("m2"), a("m3")]
    _compacted_by_first(runtime, db, Strategy.DETACH_DB, history, u("first question"))
    engine = Engine()
    engine.last_prompt_tokens, engine.last_completion_tokens = 96_000, 10  # type: ignore[attr-defined]
    engine.awaiting_real_usage_after_compression = False  # type: ignore[attr-defined]
    other = Agent(db, engine)
    other._usage_anchor = {"prompt_tokens": 96_000}  # type: ignore[attr-defined]
    stale = [*[dict(m) for m in history], u("second question")]
    guarded_compression(runtime, Strategy.DETACH_DB, other, stale, lambda: ([], "s"))
    assert (engine.last_prompt_tokens, engine.last_completion_tokens) == (-1, 0)  # type: ignore[attr-defined]
    assert engine.awaiting_real_usage_after_compression is True  # type: ignore[attr-defined]
    assert other._usage_anchor is None  # type: ignore[attr-defined]
