"""The wrappers on the gateway: one turn's transcript re-based on the stable id, the message
handler's buffering while a session compresses, the busy message, and the inbox's drain,
hand-off and replay; and on the TUI's and the interactive CLI's input during a busy turn
(:mod:`.buffering` holds the logic they call)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..host import client_events
from ..runtime import Runtime
from . import buffering
from .envelope import fails_as
from .row import HostCall, SeamRow, Wrapper, call_arg

# After a gateway turn: (runtime, row, runner, session id, the compaction log's mark before the turn, result).
Rebase = Callable[[Runtime, SeamRow, Any, str, int, Any], None]


def gateway_turn_wrapper(runtime: Runtime, row: SeamRow, rebase: Rebase | None = None) -> Wrapper:
    """Around one gateway turn: a turn addressed to a session the guard handed off
    runs in its child; guard notices for the chat (hand-off packet written, fork)
    are sent as messages of their own, before the turn (decided during gateway
    hygiene) and after it (decided during the turn); then ``rebase``, where the row's
    wrapper passes one (0.13-0.17, whose gateway does not re-baseline by itself:
    :mod:`.legacy.gateway_transcript`), brings the gateway's transcript bookkeeping in
    line after the guard compacted in place."""

    @fails_as("this turn runs as Hermes routed it, without the guard's notices or transcript re-base")
    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sid = kwargs["session_id"] if "session_id" in kwargs else args[4]
        source = kwargs["source"] if "source" in kwargs else args[3]
        target = runtime.compactions.fork_target(sid) if sid else sid
        if target != sid:
            # A turn still addressed to a handed-off session (the host drains queued
            # follow-ups with the id the turn started on): run it in the child.
            runtime.audit.operation(sid).info("handoff.redirected", child_session_id=target)
            if "session_id" in kwargs:
                kwargs = {**kwargs, "session_id": target}
            else:
                args = (*args[:4], target, *args[5:])
            sid = target
        mark = runtime.compactions.mark()
        notices = runtime.notices.pop(sid) if sid else []
        await _deliver(instance, source, sid, notices)
        result = await wrapped(*args, **kwargs)
        # after the turn, two sub-steps that each degrade alone and keep Hermes's result: notices
        # that cannot be read still let the transcript be re-based, and a re-base that fails names
        # the JSONL it left (for `doctor`) rather than the turn
        if sid:
            with failing_open(row, "guard notices decided during this turn are not sent", when="after the turn",
                              level=logging.DEBUG, advice=None) as failed:
                after = runtime.notices.pop(sid)
                moved_to = runtime.compactions.fork_target(sid)
                if moved_to != sid:
                    after += runtime.notices.pop(moved_to)
            if failed:
                after = []
            await _deliver(instance, source, sid, after)
        if sid and rebase is not None:
            with failing_open(row, f"the gateway's JSONL transcript for {sid} may still hold pre-compaction history "
                                   "(state.db is correct)", when="after the turn", advice="doctor"):
                rebase(runtime, row, instance, sid, mark, result)
        return result

    return wrapper


async def _deliver(runner: Any, source: Any, sid: str | None, notices: list[str]) -> None:
    for text in notices:
        with failing_open(f"delivering a notice to the chat of {sid}", "the chat does not get this guard notice",
                          level=logging.WARNING, advice=None):
            await host.gateway_send(runner, source, text)


def gateway_message_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """One message's handling in the gateway (``GatewayRunner._handle_message``):

    * while it runs, remember which chat the message came from, so the guard's
      ``/handoff-packet`` slash command (whose handler only gets its argument text) knows
      which session it was typed in;
    * after it ends (any outcome but cancellation), keep the buffered queue moving: turns
      that never drain (``/compress``, a failed turn) hand the queue to the adapter's
      next-up slot."""

    def after(instance: Any, event: Any) -> None:
        with failing_open(row, "buffered messages wait for the next turn or restart", when="after the message"):
            buffering.on_handler_done(runtime, instance, event)

    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        event = call_arg(args, kwargs, 0, "event")
        with failing_open(row, "buffered messages are still delivered", when="before the message"):
            buffering.on_handler_start(instance, event)
        try:
            with ExitStack() as stack:
                with failing_open(row, "guard slash commands in this message cannot tell which chat they came "
                                       "from"):
                    stack.enter_context(host.gateway_message_context(instance, event))
                result = await wrapped(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception:
            after(instance, event)
            raise
        after(instance, event)
        return result

    return wrapper


def busy_message_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """A message for a busy session: buffer it while the session compresses (see buffering)."""

    @fails_as("Hermes handles this message as it would without the guard")
    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_host = HostCall(wrapped, *args, **kwargs)  # Hermes's coroutine, awaited where it is made
        event = call_arg(args, kwargs, 0, "event")
        session_key = call_arg(args, kwargs, 1, "session_key")
        return await buffering.on_busy_message(runtime, instance, event, session_key, call_host)

    return wrapper


def buffer_drain_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Where a finished turn picks its follow-up: the oldest buffered message when Hermes has none."""

    @fails_as("buffered messages wait for the next turn or restart")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        picked = wrapped(*args, **kwargs)
        return buffering.on_drain(runtime, instance, call_arg(args, kwargs, 0, "session_key"), picked)

    return wrapper


def buffer_replay_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """Gateway startup (and 0.19 platform reconnect): replay what an earlier runner left buffered."""

    @fails_as("buffered messages stay in session_guard_inbox for the next start")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        buffering.replay(runtime, instance, call_arg(args, kwargs, 0, "platform"))
        return result

    return wrapper


def run_events_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``APIServerAdapter._make_run_event_callback(run_id, loop)``: the run's event callback
    also passes the guard's compaction events (``compaction.*``, docs/events.md) to the
    run's ``/v1/runs/{id}/events`` stream; every other event goes to Hermes's callback."""

    @fails_as("this run's event stream carries no compaction events", once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        callback = wrapped(*args, **kwargs)
        run_id = call_arg(args, kwargs, 0, "run_id")
        loop = call_arg(args, kwargs, 1, "loop")

        def with_compaction_events(event_type: str, *cb_args: Any, **cb_kwargs: Any) -> Any:
            # called by Hermes later, outside the envelope: its own handler
            with failing_open(row, "the event goes to Hermes's own callback (a compaction event is dropped there)",
                              once=True):
                event = client_events.run_event(run_id, event_type, cb_kwargs)
                if event is not None:
                    client_events.push_run_event(instance, run_id, loop, event)
                    return None
            return callback(event_type, *cb_args, **cb_kwargs)

        return with_compaction_events

    return wrapper


_STREAM_QUEUE = (4, "stream_q")  # the writers' queue: (self,) request, id, model, created, stream_q, ...


def stream_comments_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``APIServerAdapter._write_sse_chat_completion`` / ``_write_sse_responses(request, id,
    model, created, stream_q, ...)``: the writer reads its queue through a
    :class:`~..host.client_events.CommentingQueue`, so the guard's compaction comment lines
    (``: session_guard compaction.started ...``) reach that stream in order and nothing a
    client parses as data does (docs/events.md)."""

    @fails_as("this stream carries no compaction comment line", once=True)
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = call_arg(args, kwargs, 0, "request")
        index, name = _STREAM_QUEUE
        inner = call_arg(args, kwargs, index, name)

        async def write(line: bytes) -> None:
            # called while the stream is written, outside the envelope: its own handler
            with failing_open(row, "this comment line is left out; the stream goes on", once=True):
                await request.writer.write(line)

        commenting = client_events.CommentingQueue(inner, write, asyncio.get_running_loop())
        if name in kwargs:
            kwargs = {**kwargs, name: commenting}
        else:
            args = (*args[:index], commenting, *args[index + 1:])
        return wrapped(*args, **kwargs)

    return wrapper


def tui_busy_interrupt_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``tui_gateway.server._interrupt_busy_session(sid, session, agent)``: called after a
    prompt for a busy session was queued, in the ``interrupt`` busy-input mode. While the
    session compacts the interrupt is left out (see buffering.interrupt_or_queue)."""

    @fails_as("the running turn is interrupted as without the guard")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        interrupt = HostCall(wrapped, *args, **kwargs)
        buffering.interrupt_or_queue(runtime, call_arg(args, kwargs, 2, "agent"), interrupt)
        return interrupt.result

    return wrapper


def cli_busy_interrupt_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``HermesCLI.chat(message, ...)``: one turn of the interactive CLI. Before it runs,
    the CLI's interrupt queue (what the prompt puts input typed during a turn on, in the
    ``interrupt`` busy-input mode) is made to hold such input back while the session
    compacts (see buffering.defer_cli_interrupts)."""

    @fails_as("input typed while this turn compacts interrupts it as without the guard")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        buffering.defer_cli_interrupts(runtime, instance)
        return wrapped(*args, **kwargs)

    return wrapper


def _tui_enqueue_wrapper(place: Callable[[Runtime, dict[str, Any], Callable[[], Any]], Any]
                         ) -> Callable[[Runtime, SeamRow], Wrapper]:
    """A wrapper factory for the TUI gateway's ``_enqueue_prompt(session, text, transport, ...)``
    that lets ``place(runtime, session, enqueue)`` decide how the host's own call queues the prompt."""

    def factory(runtime: Runtime, row: SeamRow) -> Wrapper:
        @fails_as("the prompt is queued as without the guard (merged into one already queued)")
        def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            enqueue = HostCall(wrapped, *args, **kwargs)
            session = call_arg(args, kwargs, 0, "session")
            if not isinstance(session, dict):
                return enqueue()
            return place(runtime, session, enqueue)

        return wrapper

    return factory


# 0.19-0.20: the session's one next-turn slot. While the session compacts a second prompt is
# held back in order instead of being merged into the first (buffering.hold_or_enqueue).
tui_prompt_enqueue_wrapper = _tui_enqueue_wrapper(lambda *a: buffering.hold_or_enqueue(*a))
# 0.21+: a FIFO of envelopes; the one a prompt landed in is returned (the busy submit makes it
# durable). A prompt that arrives while the session compacts keeps an envelope of its own, so
# it is its own turn, in order (buffering.enqueue_apart).
tui_envelope_enqueue_wrapper = _tui_enqueue_wrapper(lambda *a: buffering.enqueue_apart(*a))


def tui_prompt_drain_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``tui_gateway.server._drain_queued_prompt(rid, sid, session)``: an empty slot first
    gets the oldest prompt held back during a compaction."""

    @fails_as("held prompts wait for the next drain")
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = call_arg(args, kwargs, 2, "session")
        if isinstance(session, dict) and session.get(buffering.HELD_PROMPTS):
            buffering.release_held_prompt(session, session["history_lock"])
        return wrapped(*args, **kwargs)

    return wrapper
