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
        assert not buffering.hold_or_enqueue(rt, session, _slot(session, text))
    assert session["queued_prompt"]["text"] == "b\n\nc"


def test_the_interrupt_is_left_out_only_while_compacting(compacting: dict[str, bool]) -> None:
    rt, hits = _runtime(), []
    assert not buffering.interrupt_or_queue(rt, object(), lambda: hits.append(1))
    compacting["on"] = False
    assert buffering.interrupt_or_queue(rt, object(), lambda: hits.append(1))
    assert hits == [1] and rt.events == ["turn.interrupt_deferred"]
