"""A prompt that arrives through the TUI gateway while the session's running turn
compacts: queued and answered as its own turn after the compacted one, never an
interrupt that merges it into that turn. Outside a compaction the user's
``display.busy_input_mode`` (``interrupt`` by default) is untouched.

0.13-0.18's TUI gateway refuses a prompt for a busy session ("session busy"): nothing
interrupts there, the client retries. 0.21+ writes a prompt's row when it is sent and
queues it itself while the session compacts; its turn must still send and store it once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from hermes_session_guard.seams.buffering import HELD_PROMPTS
from hermes_session_guard.seams.table import select_row
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .api_turns import answer_for, echo_last_user
from .conftest import DEFERS_TO_USAGE, HOST, anchor_on_real_usage
from .tui_import import TuiFrames
from .waiting import wait_for

SID = "20260701_140000_tuiq01"
WAIT = 180
_ROW = select_row("tui_busy_interrupt", HOST)
pytestmark = pytest.mark.skipif(
    HOST < (0, 19, 0),
    reason=f"Hermes {'.'.join(map(str, HOST))}: {_ROW.note if _ROW else 'no TUI busy-input row'}")


def _submit(server: Any, frames: TuiFrames, live: str, text: str) -> dict[str, Any]:
    from tui_gateway.transport import bind_transport

    bind_transport(frames)
    ack = server.handle_request({"jsonrpc": "2.0", "id": text, "method": "prompt.submit",
                                 "params": {"session_id": live, "text": text}})
    assert "result" in ack, ack
    return dict(ack["result"])


def _idle(session: dict[str, Any]) -> bool:
    """The TUI gateway's session runs no turn and has nothing queued for one: ``running``
    is off (a turn sets it before it starts and clears it after its ``message.complete``),
    its next-turn slot ``queued_prompt`` (0.19+) and the FIFO after it ``queued_prompts``
    (0.20+) are empty, the guard holds no prompt back for the slot (0.19-0.20), and the
    thread of its last turn (``_run_thread``: the turn, then its drain of the queue) has
    ended."""
    thread = session.get("_run_thread")
    return not (session.get("running") or session.get("queued_prompt") or session.get("queued_prompts")
                or session.get(HELD_PROMPTS) or (thread is not None and thread.is_alive()))


def _wait_completed(server: Any, frames: TuiFrames, live: str, n: int,
                    quiet: float | None = None) -> list[dict[str, Any]]:
    """The session's completed turns once there are ``n``; with ``quiet``, also once none
    has completed for that many seconds after the first (turns folded into fewer). Either
    way only once the session is idle (:func:`_idle`), so that a further (wrong) turn has
    completed by then."""
    deadline = time.monotonic() + WAIT  # a bound on the loop, not on the turns' duration
    seen, since = 0, time.monotonic()
    while len(frames.completed(live)) < n:
        if len(frames.completed(live)) != seen:
            seen, since = len(frames.completed(live)), time.monotonic()
        if quiet is not None and seen and time.monotonic() - since > quiet:
            break
        assert time.monotonic() < deadline, f"{len(frames.completed(live))} of {n} TUI turns completed"
        time.sleep(0.05)
    session = server._sessions[live]
    assert wait_for(lambda: _idle(session), max(0.0, deadline - time.monotonic())), \
        f"the TUI session is still busy after {len(frames.completed(live))} completed turns"
    return frames.events(live, "message.complete")


def _prompt_during_compaction(db: Any, llm: FakeLLMServer, tui: tuple[Any, TuiFrames], texts: list[str],
                              quiet: float | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``texts[0]`` compacts (summary held); the others arrive meanwhile. Returns the acks
    of the later ones and every completion."""
    server, frames = tui
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages, source="tui")
    gate = threading.Event()
    llm.configure(summary_gate=gate, reply_fn=echo_last_user)
    resumed = server.handle_request({"jsonrpc": "2.0", "id": 1, "method": "session.resume",
                                     "params": {"session_id": SID, "eager_build": True}})
    assert "result" in resumed, resumed
    live = resumed["result"]["session_id"]
    if DEFERS_TO_USAGE:  # a long-lived TUI agent has its provider's reading of the session
        anchor_on_real_usage(server._sessions[live]["agent"], messages)
    try:
        _submit(server, frames, live, texts[0])
        assert llm.summary_started.wait(60), "the first TUI turn never compacted"
        acks = [_submit(server, frames, live, t) for t in texts[1:]]
    finally:
        gate.set()
    return acks, _wait_completed(server, frames, live, len(texts), quiet)


def _asked(llm: FakeLLMServer) -> list[str]:
    """The last user message of each chat request to the model."""
    out = []
    for rec in llm.chat_requests():
        users = [m for m in rec.body.get("messages") or [] if m.get("role") == "user"]
        if users:
            out.append(str(users[-1].get("content") or "").strip())
    return out


@pytest.mark.parametrize("during", [1, 3])
def test_prompts_during_compaction_are_their_own_turns_after_the_compacted_one(
        guard: Any, db: Any, llm: FakeLLMServer, tui: tuple[Any, TuiFrames], during: int) -> None:
    texts = [f"msg-{i}-tui" for i in range(during + 1)]
    acks, done = _prompt_during_compaction(db, llm, tui, texts)
    assert [a.get("status") for a in acks] == ["queued"] * during
    assert [str(d.get("text") or "").strip() for d in done] == [answer_for(t) for t in texts]
    asked = _asked(llm)  # 0.20+ may ask twice for one turn (e.g. a title): what matters is never merged, in order
    assert set(asked) <= set(texts) and list(dict.fromkeys(asked)) == texts
    live = [(m.get("role"), str(m.get("content") or "").strip()) for m in db.get_messages_as_conversation(SID)]
    expected = [pair for t in texts for pair in (("user", t), ("assistant", answer_for(t)))]
    assert live[-len(expected):] == expected
    assert len(llm.summary_requests()) == 1


def test_without_the_guard_the_prompt_interrupts_and_is_merged(no_guard: None, db: Any, llm: FakeLLMServer,
                                                                tui: tuple[Any, TuiFrames]) -> None:
    """The reproduction: Hermes as shipped interrupts the compacting turn (0.19-0.20), or
    folds the prompts that arrived meanwhile into one turn (0.21+)."""
    texts = ["msg-0-bare", "msg-1-bare", "msg-2-bare"]
    _, done = _prompt_during_compaction(db, llm, tui, texts, quiet=10.0)
    answers = [str(d.get("text") or "").strip() for d in done]
    assert answers != [answer_for(t) for t in texts]


def test_outside_compaction_the_interrupt_setting_is_untouched(guard: Any, db: Any, llm: FakeLLMServer,
                                                               tui: tuple[Any, TuiFrames]) -> None:
    """A prompt for a turn that is not compacting interrupts it (Hermes's default mode)."""
    server, frames = tui
    probe.seed_session(db, SID, probe.seed_messages(4, chars=40), source="tui")
    asked, interrupted = threading.Event(), threading.Event()

    def reply(body: dict[str, Any]) -> str:
        answer = echo_last_user(body)
        if answer == answer_for("msg-0-plain"):  # the first turn stays busy until it is interrupted
            asked.set()
            interrupted.wait(30)
        return answer

    llm.configure(reply_fn=reply)
    resumed = server.handle_request({"jsonrpc": "2.0", "id": 1, "method": "session.resume",
                                     "params": {"session_id": SID, "eager_build": True}})
    live = resumed["result"]["session_id"]
    agent = server._sessions[live]["agent"]
    real = agent.interrupt

    def spy(*args: Any, **kwargs: Any) -> Any:
        interrupted.set()
        return real(*args, **kwargs)

    agent.interrupt = spy
    try:
        _submit(server, frames, live, "msg-0-plain")
        assert asked.wait(60), "the first turn never asked the model"
        ack = _submit(server, frames, live, "msg-1-plain")
        # 0.20+ first redirects the live turn in place when the agent supports it (its own interrupt mode)
        if ack.get("status") != "redirected":
            assert ack.get("status") == "queued"
            assert interrupted.wait(30), "the running turn was not interrupted"
    finally:
        interrupted.set()
    _wait_completed(server, frames, live, 1 if ack.get("status") == "redirected" else 2)


