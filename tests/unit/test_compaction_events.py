"""The compaction events (hook ``session_guard_compaction_event``): one at the start and one
at the end of every guarded compaction, with ids and counts and never message text; their
delivery to an API server agent's callbacks and the run-event shape; and, when the
OpenTelemetry SDK is importable, the span (nested under the current one) and the metrics,
read back through an in-memory exporter and reader."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import telemetry
from hermes_session_guard.config import GuardConfig, LockConfig
from hermes_session_guard.hooks.manager import get_plugin_manager
from hermes_session_guard.hooks.specs import CompactionEvent, hookimpl
from hermes_session_guard.host import client_events
from hermes_session_guard.runtime import Runtime
from hermes_session_guard.seam_behaviour import Strategy
from hermes_session_guard.seams.compression import guarded_compression

from .test_compression_contract import Agent, Engine

TEXTS = [f"secret-text-{i}" for i in range(10)]


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    rt = Runtime(config=replace(GuardConfig(), lock=LockConfig(wait_seconds=0.05)), host_version="0.19.0",
                 fixed_home=tmp_path)
    yield rt
    rt.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[CompactionEvent] = []

    @hookimpl
    def session_guard_compaction_event(self, event: CompactionEvent, agent: Any) -> None:
        self.events.append(event)


@pytest.fixture
def recorded() -> Any:
    recorder = Recorder()
    pm = get_plugin_manager()
    pm.register(recorder, name="test-recorder")
    yield recorder.events
    pm.unregister(name="test-recorder")


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(TEXTS)]


def _compact(runtime: Runtime, db: Any, engine: Engine | None = None, agent: Any = None) -> Any:
    agent = agent or Agent(db, engine or Engine())
    messages = _messages()
    return guarded_compression(runtime, Strategy.DETACH_DB, agent, messages,
                               lambda: agent._compress_context(messages, "s"))


def _no_text(payload: Any) -> None:
    dumped = json.dumps(payload, default=str)
    assert not any(t in dumped for t in TEXTS), dumped


def test_a_done_compaction_says_started_then_completed(runtime: Runtime, db: Any, recorded: list) -> None:
    _compact(runtime, db)
    started, ended = recorded
    assert (started.name, ended.name) == ("compaction.started", "compaction.completed")
    assert started.op_id == ended.op_id and started.session_id == ended.session_id == "S1"
    assert (started.messages_before, started.messages_after, started.outcome) == (10, None, None)
    assert (ended.outcome, ended.messages_before, ended.messages_after) == ("done", 10, 3)
    assert ended.summary_chars and ended.snapshot_id and ended.snapshot_id.startswith("S1.snapshot.")
    assert ended.release == "0.19.0" and ended.strategy == Strategy.DETACH_DB and ended.messages_buffered == 0
    assert ended.duration_ms is not None and ended.summary_ms is not None and ended.lock_wait_ms is not None
    _no_text([e.fields() for e in recorded])


def test_a_failed_summary_says_started_then_failed_with_its_reason(runtime: Runtime, db: Any,
                                                                   recorded: list) -> None:
    _compact(runtime, db, Engine(fail="HTTP 500 from the summary model"))
    assert [e.name for e in recorded] == ["compaction.started", "compaction.failed"]
    assert recorded[-1].outcome == "failed" and "HTTP 500" in (recorded[-1].reason or "")
    assert recorded[-1].snapshot_id is None and recorded[-1].messages_after == 10


def test_an_exception_in_the_host_ends_with_failed_and_its_error_type(runtime: Runtime, db: Any,
                                                                      recorded: list) -> None:
    agent = Agent(db, Engine())

    def boom() -> Any:
        raise TimeoutError("a provider quoting secret-text-3")

    with pytest.raises(TimeoutError):
        guarded_compression(runtime, Strategy.DETACH_DB, agent, _messages(), boom)
    assert [e.name for e in recorded] == ["compaction.started", "compaction.failed"]
    assert recorded[-1].error_type == "TimeoutError" and recorded[-1].reason == "TimeoutError"
    _no_text([e.fields() for e in recorded])  # the exception's message stays out of the event


def test_a_failing_subscriber_never_fails_the_compaction(runtime: Runtime, db: Any) -> None:
    class Broken:
        @hookimpl
        def session_guard_compaction_event(self, event: CompactionEvent, agent: Any) -> None:
            raise RuntimeError("subscriber bug")

    pm = get_plugin_manager()
    pm.register(Broken(), name="test-broken")
    try:
        out, _ = _compact(runtime, db)
    finally:
        pm.unregister(name="test-broken")
    assert len(out) == 3


class ApiAgent(Agent):
    """An agent as the API server's handlers build it: platform and their callbacks."""

    platform = "api_server"

    def __init__(self, db: Any, engine: Engine) -> None:
        super().__init__(db, engine)
        self.calls: list[tuple[Any, ...]] = []

        def _on_tool_start(*args: Any) -> None:
            self.calls.append(("start", *args))

        def _on_tool_complete(*args: Any) -> None:
            self.calls.append(("complete", *args))

        # named as inside the chat completions handler (what the delivery checks)
        _on_tool_start.__qualname__ = "APIServerAdapter._handle_chat_completions.<locals>._on_tool_start"
        _on_tool_complete.__qualname__ = "APIServerAdapter._handle_chat_completions.<locals>._on_tool_complete"
        self.tool_start_callback = _on_tool_start
        self.tool_complete_callback = _on_tool_complete
        self.tool_progress_callback = lambda *a, **kw: self.calls.append(("progress", a, kw))


def test_an_api_server_agent_gets_run_events_and_no_progress_records_by_default(runtime: Runtime, db: Any) -> None:
    """Without ``events.chat_completions_records`` the chat completions handler's tool
    callbacks are not called (its stream gets a comment line, test_client_streams.py)."""
    agent = ApiAgent(db, Engine())
    _compact(runtime, db, agent=agent)
    assert [c[0] for c in agent.calls] == ["progress", "progress"]


def test_an_api_server_agent_gets_progress_records_and_run_events(current: Runtime, db: Any) -> None:
    current.config = replace(current.config, events=replace(current.config.events, chat_completions_records=True))
    agent = ApiAgent(db, Engine())
    _compact(current, db, agent=agent)
    kinds = [c[0] for c in agent.calls]
    assert kinds == ["progress", "start", "progress", "complete"]
    (_, start_args, start_kw), (_, end_args, end_kw) = agent.calls[0][0:3], agent.calls[2][0:3]
    assert start_kw["op_id"] == end_kw["op_id"] and start_kw["messages_before"] == 10
    assert start_args == ("compaction.started", client_events.TOOL_NAME, None, None)
    assert end_args[0] == "compaction.completed" and end_kw["outcome"] == "done" and end_kw["messages_after"] == 3
    call_id = agent.calls[1][1]
    assert call_id == agent.calls[3][1] and call_id.startswith(client_events.TOOL_NAME + ".")
    assert agent.calls[1][2] == agent.calls[3][2] == client_events.TOOL_NAME
    _no_text([list(c) for c in agent.calls])


def test_other_entry_points_and_other_handlers_are_not_told(runtime: Runtime, db: Any) -> None:
    cli = ApiAgent(db, Engine())
    cli.platform = "cli"
    _compact(runtime, db, agent=cli)
    assert cli.calls == []
    responses = ApiAgent(db, Engine())
    responses.session_id = "S3"
    responses.tool_start_callback.__qualname__ = "APIServerAdapter._handle_responses.<locals>._on_tool_start"
    responses.tool_complete_callback.__qualname__ = "APIServerAdapter._handle_responses.<locals>._on_tool_complete"
    _compact(runtime, db, agent=responses)
    assert [c[0] for c in responses.calls] == ["progress", "progress"]  # run events only


def _tui_status_callback(calls: list[tuple[str, str]]) -> Any:
    """A status callback as the TUI gateway builds one (a function of a tui_gateway module)."""
    namespace: dict[str, Any] = {"__name__": "tui_gateway.agent_callbacks", "calls": calls}
    exec("def status(kind, text=None):\n    calls.append((kind, text))\n", namespace)
    return namespace["status"]


def test_a_tui_agent_gets_the_facts_on_its_status_bar_when_its_compaction_ends(runtime: Runtime, db: Any) -> None:
    """Hermes posts its own line when it compacts (every release): the guard adds no line,
    only its facts on the status bar (kind ``status``) when the compaction ends."""
    calls: list[tuple[str, str]] = []
    tui = ApiAgent(db, Engine())
    tui.platform = "tui"
    tui.status_callback = _tui_status_callback(calls)
    _compact(runtime, db, agent=tui)
    assert tui.calls == []  # no tool rows, no run events
    assert [kind for kind, _ in calls] == ["status"]
    (ended,) = (text for _, text in calls)
    op = ended.split("(op ", 1)[1].split(",")[0]
    assert ended.startswith(f"Context compacted: 10 -> 3 messages (op {op}, snapshot S1.snapshot.")
    _no_text([list(c) for c in calls])


def test_a_status_callback_of_another_entry_point_is_not_called(runtime: Runtime, db: Any) -> None:
    calls: list[tuple[str, str]] = []
    gateway = ApiAgent(db, Engine())
    gateway.platform = "telegram"  # the platform gateway's callback posts into the chat
    gateway.status_callback = lambda kind, text=None: calls.append((kind, text))
    _compact(runtime, db, agent=gateway)
    assert calls == []


@pytest.mark.parametrize("outcome,reason,expected", [
    ("adopted", None, "Context compaction: this session was already compacted, continuing on it (op ab12)"),
    ("skipped", "lock held by another process", "Context compaction skipped, nothing changed: lock held by "
     "another process (op ab12)"),
    ("failed", "APIError", "Context compaction failed, nothing changed: APIError (op ab12)"),
])
def test_the_status_line_of_each_outcome(outcome: str, reason: str | None, expected: str) -> None:
    event = CompactionEvent(name=f"compaction.{'failed' if outcome == 'failed' else 'skipped'}", session_id="S",
                            op_id="ab12", strategy="host_in_place", release="0.19.0", messages_before=5,
                            messages_after=5, outcome=outcome, reason=reason)
    assert client_events.status_text(event) == expected


def test_run_event_shape() -> None:
    event = client_events.run_event("run_1", "compaction.failed", {"op_id": "abc", "reason": "x"})
    assert event is not None and event["event"] == "compaction.failed" and event["run_id"] == "run_1"
    assert event["op_id"] == "abc" and isinstance(event["timestamp"], float)
    assert client_events.run_event("run_1", "tool.started", {}) is None


# -- OpenTelemetry ------------------------------------------------------------------------
def test_without_opentelemetry_nothing_happens(monkeypatch: pytest.MonkeyPatch, runtime: Runtime, db: Any) -> None:
    import builtins

    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    telemetry.reset()
    monkeypatch.setattr(builtins, "__import__", no_otel)
    monkeypatch.setattr(telemetry.importlib, "import_module", lambda name: no_otel(name))
    try:
        out, _ = _compact(runtime, db)
        assert len(out) == 3 and telemetry._state == {"instruments": None} and telemetry._open == {}
    finally:
        telemetry.reset()


@pytest.fixture(scope="module")
def otel() -> Any:
    sdk_trace = pytest.importorskip(
        "opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed (the `test` extra names it)")
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test already set this process's OpenTelemetry providers")
    telemetry.reset()
    yield exporter, reader, trace
    telemetry.reset()


def _metrics(reader: Any) -> dict[str, tuple[Any, Any]]:
    """Metric name -> (metric, its instrumentation scope), from the in-memory reader."""
    out: dict[str, tuple[Any, Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = (metric, sm.scope)
    return out


def _points(reader: Any) -> dict[str, list[Any]]:
    return {name: list(metric.data.data_points) for name, (metric, _) in _metrics(reader).items()}


def test_one_span_per_compaction_nested_under_the_current_one(otel: Any, runtime: Runtime, db: Any) -> None:
    exporter, reader, trace = otel
    exporter.clear()
    tracer = trace.get_tracer("test")
    seen: list[Any] = []

    class TracedEngine(Engine):
        def compress(self, messages: list[dict], current_tokens: int | None = None) -> list[dict]:
            with tracer.start_as_current_span("summary call") as span:  # an instrumented LLM call
                seen.append(span)
                return super().compress(messages, current_tokens)

    with tracer.start_as_current_span("turn") as turn:
        _compact(runtime, db, TracedEngine())
        assert trace.get_current_span() is turn  # the compaction's span is no longer current
    spans = {s.name: s for s in exporter.get_finished_spans()}
    compaction = spans[telemetry.SPAN_NAME]
    assert compaction.parent is not None and compaction.parent.span_id == turn.get_span_context().span_id
    assert spans["summary call"].parent.span_id == compaction.context.span_id
    attrs = dict(compaction.attributes)
    assert attrs["session.id"] == "S1" and attrs["session_guard.outcome"] == "done"
    assert (attrs["session_guard.messages_in"], attrs["session_guard.messages_out"]) == (10, 3)
    assert attrs["session_guard.hermes_release"] == "0.19.0" and attrs["session_guard.strategy"] == Strategy.DETACH_DB
    assert 0 <= attrs["session_guard.summary.duration"] < 60 and "error.type" not in attrs  # seconds
    _no_text(attrs)


def test_names_units_attributes_and_scope_follow_the_semantic_conventions(otel: Any, runtime: Runtime,
                                                                          db: Any) -> None:
    """Durations in seconds (unit ``s``, no ``*_ms``), the conventions' ``session.id``, every
    other attribute under ``session_guard.`` on span and metrics alike, and a scope with the
    guard's name and version."""
    from hermes_session_guard import __version__

    exporter, reader, _ = otel
    exporter.clear()
    _compact(runtime, db)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == telemetry.SPAN_NAME]
    assert (span.instrumentation_scope.name, span.instrumentation_scope.version) == (
        "hermes_session_guard", __version__)
    keys = set(span.attributes)
    assert "session.id" in keys and "session_guard.session_id" not in keys
    assert {k for k in keys if k not in ("session.id", "error.type")} <= {
        k for k in keys if k.startswith("session_guard.")}
    assert not any(k.endswith("_ms") for k in keys), keys
    assert {"session_guard.summary.duration", "session_guard.lock_wait.duration"} <= keys
    metrics = _metrics(reader)
    units = {name: metric.unit for name, (metric, _) in metrics.items() if name.startswith("session_guard.")}
    expected = {"session_guard.compactions": "{compaction}", "session_guard.compaction.duration": "s",
                "session_guard.compaction.lock_wait.duration": "s",
                "session_guard.compaction.messages_buffered": "{message}"}  # a counter appears once it counts
    assert units.items() <= expected.items() and set(expected) - set(units) <= {
        "session_guard.compaction.messages_buffered"}, units
    for name, (_, scope) in metrics.items():
        if name.startswith("session_guard."):
            assert (scope.name, scope.version) == ("hermes_session_guard", __version__), name
    for name in ("session_guard.compactions", "session_guard.compaction.duration"):
        for point in metrics[name][0].data.data_points:
            assert set(point.attributes) == {"session_guard.outcome"}, (name, point.attributes)
    (duration,) = [p for p in metrics["session_guard.compaction.duration"][0].data.data_points
                   if p.attributes["session_guard.outcome"] == "done"]
    assert 0 < duration.sum / duration.count < 60  # seconds, not milliseconds
    _no_text([dict(span.attributes)])


def test_a_failed_compaction_span_has_error_status_and_the_metrics_count_it(otel: Any, runtime: Runtime,
                                                                            db: Any) -> None:
    exporter, reader, trace = otel
    exporter.clear()
    before = {p.attributes.get("session_guard.outcome"): p.value
              for p in _points(reader).get("session_guard.compactions", [])}
    agent = Agent(db, Engine())

    def boom() -> Any:
        raise TimeoutError("secret-text-0 quoted by a provider")

    with pytest.raises(TimeoutError):
        guarded_compression(runtime, Strategy.DETACH_DB, agent, _messages(), boom)
    _compact(runtime, db)
    spans = [s for s in exporter.get_finished_spans() if s.name == telemetry.SPAN_NAME]
    failed, done = spans
    assert failed.status.status_code == trace.StatusCode.ERROR and failed.attributes["error.type"] == "TimeoutError"
    assert done.status.status_code != trace.StatusCode.ERROR
    _no_text([dict(s.attributes) for s in spans])
    points = _points(reader)
    counts = {p.attributes.get("session_guard.outcome"): p.value for p in points["session_guard.compactions"]}
    assert counts.get("failed", 0) - before.get("failed", 0) == 1
    assert counts.get("done", 0) - before.get("done", 0) == 1
    assert {p.attributes.get("session_guard.outcome")
            for p in points["session_guard.compaction.duration"]} >= {"done", "failed"}
    assert sum(p.count for p in points["session_guard.compaction.lock_wait.duration"]) >= 2


def test_an_error_before_any_outcome_still_ends_the_event(runtime: Runtime, db: Any, recorded: list,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_session_guard.seams.compaction_steps import STEPS

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lease table bug")

    monkeypatch.setattr(STEPS[Strategy.DETACH_DB], "lease_table", broken)
    with pytest.raises(RuntimeError):
        _compact(runtime, db)
    assert [e.name for e in recorded] == ["compaction.started", "compaction.failed"]
    assert recorded[-1].reason == "the compaction ended without recording an outcome"


def _callback_of_module(module: str, calls: list[tuple[str, str]]) -> Any:
    """A status callback defined in ``module``, as Hermes's entry points build them."""
    namespace: dict[str, Any] = {"__name__": module, "calls": calls}
    exec("def status(kind, text=None):\n    calls.append((kind, text))\n", namespace)
    return namespace["status"]


@pytest.fixture
def current(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """``runtime`` as the process's guard (the built-in hook reads its options)."""
    monkeypatch.setattr("hermes_session_guard.runtime.current_runtime", lambda: runtime)
    return runtime


@pytest.mark.parametrize("module", ["gateway.run", "gateway.run_turn_runner"])
def test_a_platform_gateway_agent_gets_status_lines_in_its_chat(current: Runtime, db: Any, module: str) -> None:
    calls: list[tuple[str, str]] = []
    agent = ApiAgent(db, Engine())
    agent.platform = "discord"
    agent.status_callback = _callback_of_module(module, calls)
    _compact(current, db, agent=agent)
    assert [kind for kind, _ in calls] == [client_events.TOOL_NAME] * 2
    assert calls[0][1].startswith("Compacting the context: 10 messages (op ")
    assert calls[1][1].startswith("Context compacted: 10 -> 3 messages (op ")
    assert agent.calls == [] and current.notices.pop("S1") == []  # told live: no tool rows, no notice
    _no_text([list(c) for c in calls])


def test_chat_status_off_leaves_the_chat_alone(current: Runtime, db: Any) -> None:
    current.config = replace(current.config, events=replace(current.config.events, chat_status=False))
    calls: list[tuple[str, str]] = []
    agent = ApiAgent(db, Engine())
    agent.platform = "telegram"
    agent.status_callback = _callback_of_module("gateway.run", calls)
    _compact(current, db, agent=agent)
    quiet = Agent(db, Engine())
    _compact(current, db, agent=quiet)
    assert calls == [] and current.notices.pop("S1") == []


def test_a_compaction_nobody_could_be_told_of_leaves_its_end_line_for_the_chat(current: Runtime, db: Any) -> None:
    """The gateway's session hygiene compacts with a quiet agent (no status callback): the
    end line waits for the session's next gateway turn; an agent with a channel leaves none."""
    _compact(current, db, agent=Agent(db, Engine()))
    (line,) = current.notices.pop("S1")
    assert line.startswith("Context compacted: 10 -> 3 messages (op ")
    tui = ApiAgent(db, Engine())
    tui.platform = "tui"
    tui.status_callback = _tui_status_callback([])
    _compact(current, db, agent=tui)
    assert current.notices.pop("S1") == []
