"""Input typed into the interactive CLI while its running turn compacts: each line is a
turn of its own after the compacted one, in order, never an interrupt that abandons the
compacting turn and merges the lines into one. Outside a compaction the user's
``display.busy_input_mode`` (``interrupt`` by default) is untouched.

The real ``HermesCLI`` runs a turn (``chat``) in one thread as its input loop does; the
test types into it from another the way its Enter key does while a turn runs: 0.13-0.20's
key handler (a closure of ``run``) puts the line on ``_interrupt_queue``; 0.21+'s is the
method ``_tui_enter_while_busy``."""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .api_turns import answer_for, echo_last_user
from .conftest import DEFERS_TO_USAGE, anchor_on_real_usage

SID = "20260701_150000_cliq01"
WAIT = 120  # a bound on a turn, not a measure


@pytest.fixture
def state_db(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hermes computes its default state.db path at import; follow this test's home."""
    import hermes_state

    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", home / "state.db")
    return home / "state.db"


class Cli:
    """A resumed interactive CLI, its turns run as its input loop runs them."""

    def __init__(self, sid: str) -> None:
        import cli

        self.app = cli.HermesCLI(resume=sid)
        assert self.app._preload_resumed_session()
        # what run() sets up before its input loop starts
        self.app._pending_input = queue.Queue()
        self.app._interrupt_queue = queue.Queue()
        self.answers: list[Any] = []
        self.out = io.StringIO()

    def start_turn(self, text: str) -> threading.Thread:
        def turn() -> None:
            with contextlib.redirect_stdout(self.out):
                self.answers.append(self.app.chat(text))
            self.app._agent_running = False

        self.app._agent_running = True
        thread = threading.Thread(target=turn, daemon=True)
        thread.start()
        return thread

    def run_turn(self, text: str) -> None:
        thread = self.start_turn(text)
        thread.join(WAIT)
        assert not thread.is_alive(), f"the turn for {text!r} did not end"

    def type_line(self, text: str) -> None:
        """Enter, while a turn runs (display.busy_input_mode: interrupt)."""
        assert self.app.busy_input_mode == "interrupt"
        enter = getattr(self.app, "_tui_enter_while_busy", None)
        if callable(enter):
            enter(text, [], text)
        else:
            self.app._interrupt_queue.put(text)

    def pending(self) -> list[str]:
        """What the input loop will run next, one turn per item, in order."""
        out = []
        while not self.app._pending_input.empty():
            out.append(str(self.app._pending_input.get_nowait()))
        return out


@pytest.fixture
def compacting_cli(db: Any, llm: FakeLLMServer, state_db: Path) -> Iterator[Cli]:
    probe.seed_session(db, SID, probe.seed_messages(), source="cli")
    cli = Cli(SID)
    if DEFERS_TO_USAGE:  # the CLI's agent has its provider's reading of the session
        assert cli.app._init_agent()
        anchor_on_real_usage(cli.app.agent, cli.app.conversation_history)
    yield cli


def _type_during_compaction(cli: Cli, llm: FakeLLMServer, lines: list[str]) -> None:
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    thread = cli.start_turn("trigger-cli")
    try:
        assert llm.summary_started.wait(60), "the CLI turn never compacted"
        for line in lines:
            cli.type_line(line)
    finally:
        gate.set()
    thread.join(WAIT)
    assert not thread.is_alive(), "the compacting turn did not end"


def _asked(llm: FakeLLMServer) -> list[str]:
    """The last user message of each chat request to the model."""
    from .api_turns import user_wrote

    out = []
    for rec in llm.chat_requests():
        users = [m for m in rec.body.get("messages") or [] if m.get("role") == "user"]
        if users:
            out.append(user_wrote(users[-1]).strip())
    return out


@pytest.mark.parametrize("during", [1, 3])
def test_lines_typed_during_compaction_are_their_own_turns_after_the_compacted_one(
        guard: Any, db: Any, llm: FakeLLMServer, compacting_cli: Cli, during: int) -> None:
    cli = compacting_cli
    lines = [f"line-{i}-cli" for i in range(during)]
    _type_during_compaction(cli, llm, lines)
    assert cli.answers == [answer_for("trigger-cli")], cli.out.getvalue()[-2000:]
    assert cli.app._interrupt_queue.empty()
    queued = cli.pending()
    assert queued == lines
    for line in queued:  # the input loop: one turn per line, in order
        cli.run_turn(line)
    assert cli.answers == [answer_for(t) for t in ["trigger-cli", *lines]]
    asked = _asked(llm)
    assert set(asked) <= {"trigger-cli", *lines} and list(dict.fromkeys(asked)) == ["trigger-cli", *lines]
    live = [(m.get("role"), str(m.get("content") or "").strip()) for m in db.get_messages_as_conversation(SID)]
    expected = [pair for t in ["trigger-cli", *lines] for pair in (("user", t), ("assistant", answer_for(t)))]
    assert live[-len(expected):] == expected
    assert len(llm.summary_requests()) == 1


def test_without_the_guard_a_line_interrupts_the_compacting_turn(
        no_guard: None, db: Any, llm: FakeLLMServer, compacting_cli: Cli) -> None:
    """The reproduction: Hermes as shipped abandons the compacting turn for the line."""
    cli = compacting_cli
    _type_during_compaction(cli, llm, ["line-0-bare", "line-1-bare"])
    assert cli.answers != [answer_for("trigger-cli")], cli.out.getvalue()[-2000:]  # abandoned for the lines
    assert cli.pending() != ["line-0-bare", "line-1-bare"]  # not two turns of their own


def test_outside_compaction_a_line_interrupts_the_turn(guard: Any, db: Any, llm: FakeLLMServer,
                                                       state_db: Path) -> None:
    """A line typed while a turn that is not compacting runs interrupts it (Hermes's default)."""
    probe.seed_session(db, SID, probe.seed_messages(4, chars=40), source="cli")
    cli = Cli(SID)
    asked, interrupted = threading.Event(), threading.Event()

    def reply(body: dict[str, Any]) -> str:
        answer = echo_last_user(body)
        if answer == answer_for("plain-cli"):  # the turn stays busy until it is interrupted
            asked.set()
            interrupted.wait(30)
        return answer

    llm.configure(reply_fn=reply)
    assert cli.app._init_agent()
    real = cli.app.agent.interrupt

    def spy(*args: Any, **kwargs: Any) -> Any:
        interrupted.set()
        return real(*args, **kwargs)

    cli.app.agent.interrupt = spy
    thread = cli.start_turn("plain-cli")
    try:
        assert asked.wait(60), "the turn never asked the model"
        cli.type_line("typed-cli")
        redirected = cli.app._interrupt_queue.empty() and cli.app._pending_input.empty()
        if not redirected:  # 0.20+ may steer the live turn in place instead (its own interrupt mode)
            assert interrupted.wait(30), "the running turn was not interrupted"
    finally:
        interrupted.set()
    thread.join(WAIT)
    assert not thread.is_alive()
