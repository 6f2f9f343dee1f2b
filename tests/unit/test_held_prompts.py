"""The TUI gateway's next-turn slot during a compaction (buffering.hold_or_enqueue,
release_held_prompt, interrupt_or_queue): prompts held in arrival order, never merged,
and the interrupt left out only while the session compacts."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from hermes_session_guard.seams import buffering


def _runtime() -> Any:
    events: list[str] = []

    class Op:
        def info(self, event: str, **_: Any) -> None:
            events.append(event)

    return SimpleNamespace(audit=SimpleNamespace(operation=lambda *_a: Op()), events=events)


def _slot(session: dict[str, Any], text: str) -> Any:
    """Hermes's own enqueue: one slot, a second prompt merged into it."""
    def enqueue() -> None:
        queued = session.get("queued_prompt")
        session["queued_prompt"] = {"text": f"{queued['text']}\n\n{text}" if queued else text}
    return enqueue


@pytest.fixture
def compacting(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    state = {"on": True}
    monkeypatch.setattr(buffering, "_agent_compacting", lambda _rt, _agent: ("s1", "op1" if state["on"] else None))
    return state


def test_prompts_during_a_compaction_are_held_in_order_and_released_one_by_one(compacting: dict[str, bool]) -> None:
    rt, lock = _runtime(), threading.Lock()
    session: dict[str, Any] = {"history_lock": lock}
    for text in ("b", "c", "d"):
        buffering.hold_or_enqueue(rt, session, _slot(session, text))
    assert session["queued_prompt"]["text"] == "b" and len(session[buffering.HELD_PROMPTS]) == 2
    compacting["on"] = False
    buffering.hold_or_enqueue(rt, session, _slot(session, "e"))  # after it: still behind the held ones
    order = []
    while session.get("queued_prompt"):
        order.append(session.pop("queued_prompt")["text"])
        buffering.release_held_prompt(session, lock)
    assert order == ["b", "c", "d", "e"] and buffering.HELD_PROMPTS not in session
    assert rt.events == ["turn.prompt_held"]


def test_outside_a_compaction_the_host_merges_as_it_does(compacting: dict[str, bool]) -> None:
    compacting["on"] = False
    rt, session = _runtime(), {"history_lock": threading.Lock()}
    for text in ("b", "c"):
        buffering.hold_or_enqueue(rt, session, _slot(session, text))
    assert session["queued_prompt"]["text"] == "b\n\nc" and buffering.HELD_PROMPTS not in session


def test_the_interrupt_is_left_out_only_while_compacting(compacting: dict[str, bool]) -> None:
    rt, hits = _runtime(), []
    assert not buffering.interrupt_or_queue(rt, object(), lambda: hits.append(1))
    compacting["on"] = False
    assert buffering.interrupt_or_queue(rt, object(), lambda: hits.append(1))
    assert hits == [1] and rt.events == ["turn.interrupt_deferred"]


def _fifo(session: dict[str, Any], text: str) -> Any:
    """0.21+'s enqueue: a FIFO of envelopes, a text merged into the head when nothing else waits."""
    def enqueue() -> dict[str, Any]:
        head = session.get("queued_prompt")
        if head and not session.get("queued_prompts"):
            head["text"] = f"{head['text']}\n\n{text}"
            return dict(head)  # not the head itself: the guard must not rely on identity here
        envelope = {"text": text}
        if head:
            session.setdefault("queued_prompts", []).append(envelope)
        else:
            session["queued_prompt"] = envelope
        return envelope
    return enqueue


def _drain(session: dict[str, Any]) -> list[str]:
    out = []
    while session.get("queued_prompt"):
        out.append(session["queued_prompt"]["text"])
        rest = session.pop("queued_prompts", None) or []
        session["queued_prompt"] = rest[0] if rest else None
        if rest[1:]:
            session["queued_prompts"] = rest[1:]
    return out


def test_prompts_queued_during_a_compaction_keep_envelopes_of_their_own(compacting: dict[str, bool]) -> None:
    rt, session = _runtime(), {}
    for text in ("b", "c", "d"):
        buffering.enqueue_apart(rt, session, _fifo(session, text))
    assert _drain(session) == ["b", "c", "d"]
    assert rt.events == ["turn.prompt_queued_apart"] * 3


def test_a_prompt_after_the_compaction_is_not_merged_into_one_queued_during_it(compacting: dict[str, bool]) -> None:
    rt, session = _runtime(), {}
    buffering.enqueue_apart(rt, session, _fifo(session, "b"))
    compacting["on"] = False
    buffering.enqueue_apart(rt, session, _fifo(session, "c"))
    buffering.enqueue_apart(rt, session, _fifo(session, "d"))  # behind c, which is no longer the head
    assert _drain(session) == ["b", "c", "d"]
    buffering.enqueue_apart(rt, session, _fifo(session, "e"))  # nothing from the compaction waits
    buffering.enqueue_apart(rt, session, _fifo(session, "f"))
    assert _drain(session) == ["e\n\nf"] and buffering.APART_PROMPTS not in session


def test_the_head_is_put_back_when_the_host_call_raises(compacting: dict[str, bool]) -> None:
    rt, session = _runtime(), {"queued_prompt": {"text": "b"}}

    def fails() -> None:
        raise RuntimeError("host")

    with pytest.raises(RuntimeError):
        buffering.enqueue_apart(rt, session, fails)
    assert session["queued_prompt"] == {"text": "b"} and "queued_prompts" not in session


def test_a_dropped_duplicate_keeps_the_queue_as_it_was(compacting: dict[str, bool]) -> None:
    rt, session = _runtime(), {"queued_prompt": {"text": "b"}}
    assert buffering.enqueue_apart(rt, session, lambda: None) is None
    assert session == {"queued_prompt": {"text": "b"}} and rt.events == []
