"""The interactive CLI's interrupt queue while its session compacts (seams.buffering)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.config import GuardConfig
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seams import buffering


@dataclass
class FakeCli:
    agent: Any = "agent"
    _interrupt_queue: Any = field(default_factory=queue.Queue)
    _pending_input: Any = field(default_factory=queue.Queue)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    rt = Runtime(config=GuardConfig(), host_version="0.19.0", fixed_home=tmp_path)
    monkeypatch.setattr(buffering, "current_runtime", lambda: rt)
    yield rt
    rt.close()


def _drain(q: queue.Queue[Any]) -> list[Any]:
    return [q.get_nowait() for _ in range(q.qsize())]


@pytest.mark.parametrize("compacting", [True, False])
def test_a_line_is_held_back_only_while_the_session_compacts(runtime: Runtime, monkeypatch: pytest.MonkeyPatch,
                                                             compacting: bool) -> None:
    monkeypatch.setattr(buffering, "_agent_compacting", lambda rt, agent: ("S1", "op1" if compacting else None))
    cli = FakeCli()
    original = cli._interrupt_queue
    cli._interrupt_queue.put("before")
    buffering.defer_cli_interrupts(runtime, cli)
    buffering.defer_cli_interrupts(runtime, cli)  # every turn: idempotent
    assert cli._interrupt_queue is original  # same object: the CLI's references stay
    cli._interrupt_queue.put("a")
    cli._interrupt_queue.put("b")
    if compacting:
        assert _drain(cli._interrupt_queue) == ["before"] and _drain(cli._pending_input) == ["a", "b"]
    else:
        assert _drain(cli._interrupt_queue) == ["before", "a", "b"] and _drain(cli._pending_input) == []


def test_once_the_guard_is_off_the_queue_interrupts_again(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffering, "_agent_compacting", lambda rt, agent: ("S1", "op1"))
    cli = FakeCli()
    buffering.defer_cli_interrupts(runtime, cli)
    monkeypatch.setattr(buffering, "current_runtime", lambda: None)  # uninstalled
    cli._interrupt_queue.put("a")
    assert _drain(cli._interrupt_queue) == ["a"]


def test_a_failing_check_interrupts_as_without_the_guard(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(rt: Any, agent: Any) -> Any:
        raise RuntimeError("state.db unreadable")

    monkeypatch.setattr(buffering, "_agent_compacting", broken)
    cli = FakeCli()
    buffering.defer_cli_interrupts(runtime, cli)
    cli._interrupt_queue.put("a")
    assert _drain(cli._interrupt_queue) == ["a"] and _drain(cli._pending_input) == []


def test_a_queue_of_another_kind_is_left_alone(runtime: Runtime) -> None:
    cli = FakeCli(_interrupt_queue=queue.SimpleQueue())
    buffering.defer_cli_interrupts(runtime, cli)
    assert type(cli._interrupt_queue) is queue.SimpleQueue
