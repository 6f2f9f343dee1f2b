"""Tests for the loopback fake LLM server."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from hermes_session_guard.selftest.fake_llm import (  # noqa: E402
    DEFAULT_SUMMARY_TEXT,
    SUMMARY_MARKERS,
    FakeLLMServer,
    RequestRecord,
)

from ..fake_llm import ScriptedLLMServer, ToolCallReply  # noqa: E402

SUMMARY_PROMPT = "Create a structured handoff summary of the conversation below."


@pytest.fixture
def srv() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def scripted() -> Iterator[ScriptedLLMServer]:
    """The tests' subclass (tests/fake_llm.py): failure specs, summary_predicate, tool calls."""
    with ScriptedLLMServer() as server:
        yield server


def _request(
    url: str, body: dict[str, Any] | None = None, timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Bearer test-key")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def _chat_body(content: Any = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


def _sse_data(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


# -- lifecycle / models -------------------------------------------------------


def test_urls_and_stop_release_port() -> None:
    server = ScriptedLLMServer().start()
    try:
        assert server.port > 0
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.running
    finally:
        server.stop()
    assert not server.running
    server.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models", timeout=2)


def test_models_list_and_object(srv: FakeLLMServer) -> None:
    status, headers, raw = _request(f"{srv.base_url}/models")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(raw)
    payload = json.loads(raw)
    assert payload["object"] == "list"
    assert [m["id"] for m in payload["data"]] == ["fake-model"]
    assert payload["data"][0]["object"] == "model"

    status, _, raw = _request(f"{srv.base_url}/models/fake-model")
    assert status == 200
    assert json.loads(raw)["id"] == "fake-model"

    status, _, raw = _request(f"{srv.base_url}/models/nope")
    assert status == 404
    assert "error" in json.loads(raw)


def test_models_configurable_with_context_length() -> None:
    with ScriptedLLMServer(models=["a", "org/b"], context_length=4096) as server:
        payload = json.loads(_request(f"{server.base_url}/models")[2])
        assert [m["id"] for m in payload["data"]] == ["a", "org/b"]
        assert all(m["context_length"] == 4096 for m in payload["data"])
        status, _, raw = _request(f"{server.base_url}/models/org/b")
        assert status == 200
        assert json.loads(raw)["max_model_len"] == 4096


def test_models_via_openai_sdk(srv: FakeLLMServer) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"


def test_unknown_path_is_404_and_recorded(srv: FakeLLMServer) -> None:
    status, _, raw = _request(f"{srv.base_url}/embeddings", {"input": "x"})
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    assert srv.requests[-1].path == "/v1/embeddings"
    assert srv.requests[-1].kind == "other"
    assert srv.chat_requests() == []


# -- OpenAI chat completions ---------------------------------------------------


def test_chat_non_stream_urllib(srv: FakeLLMServer) -> None:
    body = _chat_body()
    status, headers, raw = _request(f"{srv.base_url}/chat/completions", body)
    assert status == 200
    assert headers["Connection"] == "close"
    payload = json.loads(raw)
    assert payload["object"] == "chat.completion"
    assert payload["choices"][0]["message"] == {"role": "assistant", "content": "OK.", "refusal": None}
    assert payload["choices"][0]["finish_reason"] == "stop"
    usage = payload["usage"]
    assert usage["prompt_tokens"] == len(json.dumps(body)) // 4
    assert usage["completion_tokens"] == 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + 10

    [record] = srv.requests
    assert isinstance(record, RequestRecord)
    assert record.kind == "chat"
    assert record.path == "/v1/chat/completions"
    assert record.body == body
    assert record.headers["authorization"] == "Bearer test-key"
    assert record.ts <= time.time()


def test_chat_non_stream_openai_sdk(srv: FakeLLMServer) -> None:
    openai = pytest.importorskip("openai")
    srv.reply_text = "pong"
    srv.prompt_tokens = 1234
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    resp = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "ping"}])
    assert resp.choices[0].message.content == "pong"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 1234
    assert resp.usage.completion_tokens == 10
    assert len(srv.chat_requests()) == 1


def test_chat_stream_openai_sdk_with_include_usage(srv: FakeLLMServer) -> None:
    openai = pytest.importorskip("openai")
    srv.reply_text = "streamed reply that spans several chunks"
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, chunks = "", None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == srv.reply_text
    assert chunks > 3
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 10


def test_chat_stream_raw_sse(srv: FakeLLMServer) -> None:
    srv.reply_fn = lambda body: "echo:" + body["messages"][-1]["content"]
    status, headers, raw = _request(f"{srv.base_url}/chat/completions", _chat_body("abc", stream=True))
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    data = _sse_data(raw)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "echo:abc"
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] == 10


def test_chat_stream_include_usage_false_omits_usage(srv: FakeLLMServer) -> None:
    body = _chat_body(stream=True, stream_options={"include_usage": False})
    chunks = [json.loads(d) for d in _sse_data(_request(f"{srv.base_url}/chat/completions", body)[2])[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


# -- Anthropic messages ----------------------------------------------------------


def test_anthropic_non_stream_sdk(scripted: ScriptedLLMServer) -> None:
    anthropic = pytest.importorskip("anthropic")
    scripted.reply_text = "hello from fake"
    client = anthropic.Anthropic(base_url=scripted.anthropic_base_url, api_key="x", max_retries=0)
    msg = client.messages.create(
        model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.type == "message"
    assert msg.role == "assistant"
    assert msg.content[0].type == "text"
    assert msg.content[0].text == "hello from fake"
    assert msg.stop_reason == "end_turn"
    assert msg.usage.output_tokens == 10
    assert msg.usage.input_tokens > 0
    [record] = scripted.chat_requests()
    assert record.path == "/v1/messages"
    assert "anthropic-version" in record.headers


def test_anthropic_stream_sdk(scripted: ScriptedLLMServer) -> None:
    anthropic = pytest.importorskip("anthropic")
    scripted.reply_text = "a streamed anthropic answer"
    client = anthropic.Anthropic(base_url=scripted.anthropic_base_url, api_key="x", max_retries=0)
    with client.messages.stream(
        model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "a streamed anthropic answer"
    assert final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 10


def test_anthropic_stream_raw_event_order(scripted: ScriptedLLMServer) -> None:
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    status, headers, raw = _request(f"{scripted.anthropic_base_url}/v1/messages", body)
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    events = []
    for block in raw.decode().strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
        events.append(name)
    assert events[:2] == ["message_start", "content_block_start"]
    assert "content_block_delta" in events
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


# -- strict mode ---------------------------------------------------------------------


def test_strict_rejects_extra_message_key(srv: FakeLLMServer) -> None:
    srv.strict = True
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "summary", "is_compressed_summary": True},
        ],
    }
    status, _, raw = _request(f"{srv.base_url}/chat/completions", body)
    assert status == 400
    err = json.loads(raw)["error"]
    assert err["message"] == "Extra inputs are not permitted: messages[1].is_compressed_summary"
    assert err["type"] == "invalid_request_error"
    assert srv.violations == [("/v1/chat/completions", 1, "is_compressed_summary")]

    del body["messages"][1]["is_compressed_summary"]
    status, _, raw = _request(f"{srv.base_url}/chat/completions", body)
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == "OK."
    assert len(srv.violations) == 1


def test_strict_allows_tool_message_keys(srv: FakeLLMServer) -> None:
    srv.strict = True
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "user", "content": "x", "name": "u"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
        ],
    }
    assert _request(f"{srv.base_url}/chat/completions", body)[0] == 200
    assert srv.violations == []


def test_strict_openai_sdk_raises_bad_request(srv: FakeLLMServer) -> None:
    openai = pytest.importorskip("openai")
    srv.strict = True
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="is_compressed_summary"):
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "x", "is_compressed_summary": True}],  # type: ignore[misc,list-item]
        )
    ok = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
    assert ok.choices[0].message.content == "OK."


def test_strict_anthropic_messages(scripted: ScriptedLLMServer) -> None:
    scripted.strict = True
    url = f"{scripted.anthropic_base_url}/v1/messages"
    bad = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x", "cache": 1}]}
    status, _, raw = _request(url, bad)
    assert status == 400
    payload = json.loads(raw)
    assert payload["type"] == "error"
    assert payload["error"]["message"] == "Extra inputs are not permitted: messages[0].cache"
    assert scripted.violations == [("/v1/messages", 0, "cache")]
    good = {
        "model": "m",
        "max_tokens": 8,
        "metadata": {"a": 1},
        "messages": [{"role": "user", "content": "x"}],
    }
    assert _request(url, good)[0] == 200


def test_strict_off_accepts_extra_keys(srv: FakeLLMServer) -> None:
    body = _chat_body()
    body["messages"][0]["is_compressed_summary"] = True
    assert _request(f"{srv.base_url}/chat/completions", body)[0] == 200
    assert srv.violations == []


# -- summary classification ----------------------------------------------------------


@pytest.mark.parametrize("marker", SUMMARY_MARKERS)
def test_each_marker_classifies_as_summary(srv: FakeLLMServer, marker: str) -> None:
    status, _, raw = _request(f"{srv.base_url}/chat/completions", _chat_body(f"please {marker} now"))
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == DEFAULT_SUMMARY_TEXT
    assert [r.kind for r in srv.requests] == ["summary"]
    assert srv.summary_started.is_set()


def test_summary_classification_content_parts_and_system(scripted: ScriptedLLMServer) -> None:
    scripted.summary_text = "SUMMARY"
    parts = [{"type": "text", "text": "intro"}, {"type": "text", "text": "TURNS TO SUMMARIZE:\n..."}]
    r1 = json.loads(_request(f"{scripted.base_url}/chat/completions", _chat_body(parts))[2])
    assert r1["choices"][0]["message"]["content"] == "SUMMARY"

    anth = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "CONTEXT CHECKPOINT"}],
        "messages": [{"role": "user", "content": "go"}],
    }
    r2 = json.loads(_request(f"{scripted.anthropic_base_url}/v1/messages", anth)[2])
    assert r2["content"][0]["text"] == "SUMMARY"

    r3 = json.loads(_request(f"{scripted.base_url}/chat/completions", _chat_body("just chatting"))[2])
    assert r3["choices"][0]["message"]["content"] == "OK."

    assert len(scripted.summary_requests()) == 2
    assert len(scripted.chat_requests()) == 1
    assert scripted.summary_requests()[1].path == "/v1/messages"


def test_custom_summary_predicate_and_summary_fn() -> None:
    with ScriptedLLMServer(
        summary_predicate=lambda body: body.get("model") == "compressor",
        summary_fn=lambda body: f"summary of {len(body['messages'])} messages",
    ) as server:
        url = f"{server.base_url}/chat/completions"
        plain = json.loads(_request(url, _chat_body("Summarize everything"))[2])
        assert plain["choices"][0]["message"]["content"] == "OK."
        body = {"model": "compressor", "messages": [{"role": "user", "content": "a"}] * 3}
        summ = json.loads(_request(url, body)[2])
        assert summ["choices"][0]["message"]["content"] == "summary of 3 messages"
        assert [r.kind for r in server.requests] == ["chat", "summary"]


# -- latency, gate, failure injection ---------------------------------------------------


def _summary_in_thread(server: FakeLLMServer) -> tuple[threading.Thread, dict[str, Any]]:
    """A summary request sent from a thread of its own; its response lands in ``result["resp"]``.
    Returns once the server has it."""
    result: dict[str, Any] = {}

    def post() -> None:
        result["resp"] = _request(f"{server.base_url}/chat/completions", _chat_body(SUMMARY_PROMPT), timeout=30)

    worker = threading.Thread(target=post, daemon=True)
    worker.start()
    assert server.summary_started.wait(5)
    return worker, result


class _WatchedGate(threading.Event):
    """A gate that says when someone waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited_on = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waited_on.set()
        return super().wait(timeout)


def test_summary_gate_blocks_until_set(srv: FakeLLMServer) -> None:
    gate = _WatchedGate()
    srv.summary_gate = gate
    worker, result = _summary_in_thread(srv)
    assert gate.waited_on.wait(5), "the summary request never waited on the gate"
    assert worker.is_alive()
    assert "resp" not in result

    chat = _request(f"{srv.base_url}/chat/completions", _chat_body("not blocked"))
    assert json.loads(chat[2])["choices"][0]["message"]["content"] == "OK."

    gate.set()
    worker.join(10)
    assert not worker.is_alive()
    status, _, raw = result["resp"]
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == DEFAULT_SUMMARY_TEXT


def test_summary_latency_only_delays_summaries(srv: FakeLLMServer) -> None:
    srv.summary_latency = 0.5
    url = f"{srv.base_url}/chat/completions"
    t0 = time.monotonic()
    _request(url, _chat_body("hi"))
    chat_elapsed = time.monotonic() - t0
    t0 = time.monotonic()
    _request(url, _chat_body(SUMMARY_PROMPT))
    summary_elapsed = time.monotonic() - t0
    assert chat_elapsed < 0.4
    assert summary_elapsed >= 0.5


def test_fail_next_summary_status_500_then_recovers(scripted: ScriptedLLMServer) -> None:
    scripted.fail_next_summary.append(("status", 500))
    url = f"{scripted.base_url}/chat/completions"
    status, _, raw = _request(url, _chat_body(SUMMARY_PROMPT))
    assert status == 500
    assert json.loads(raw)["error"]["message"]

    assert _request(url, _chat_body("chat unaffected"))[0] == 200
    status, _, raw = _request(url, _chat_body(SUMMARY_PROMPT))
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == DEFAULT_SUMMARY_TEXT
    assert scripted.fail_next_summary == []
    assert len(scripted.summary_requests()) == 2


def test_fail_specs_empty_garbage_timeout(scripted: ScriptedLLMServer) -> None:
    url = f"{scripted.base_url}/chat/completions"
    scripted.fail_next_summary.extend([("empty",), ("garbage", 64), ("timeout", 0.2)])

    status, _, raw = _request(url, _chat_body(SUMMARY_PROMPT))
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == ""

    status, _, raw = _request(url, _chat_body(SUMMARY_PROMPT))
    assert status == 200
    assert len(raw) == 64
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")

    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(
            urllib.request.Request(url, data=json.dumps(_chat_body(SUMMARY_PROMPT)).encode()), timeout=5
        )
    assert len(scripted.summary_requests()) == 3


def test_fail_all_summaries_is_persistent_on_anthropic(scripted: ScriptedLLMServer) -> None:
    scripted.fail_all_summaries = ("status", 529)
    url = f"{scripted.anthropic_base_url}/v1/messages"
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": SUMMARY_PROMPT}]}
    for _ in range(2):
        status, _, raw = _request(url, body)
        assert status == 529
        assert json.loads(raw)["error"]["type"] == "overloaded_error"
    scripted.fail_all_summaries = None
    assert _request(url, body)[0] == 200


def test_wait_for_requests_and_reset(srv: FakeLLMServer) -> None:
    threading.Timer(0.1, _request, args=(f"{srv.base_url}/chat/completions", _chat_body())).start()
    assert srv.wait_for_requests(1, kind="chat", timeout=5)
    assert not srv.wait_for_requests(1, kind="summary", timeout=0.1)
    srv.reset()
    assert srv.requests == []


# -- the tests' subclass (tests/fake_llm.py) -----------------------------------------------


def test_the_package_server_has_no_test_only_options(srv: FakeLLMServer) -> None:
    with pytest.raises(TypeError):
        FakeLLMServer(**{"fail_all_summaries": ("status", 500)})
    for name in ("summary_predicate", "fail_next_summary", "fail_all_summaries"):
        with pytest.raises(AttributeError):
            srv.configure(**{name: None})


def test_a_failure_is_taken_on_arrival_and_applied_after_the_gate(scripted: ScriptedLLMServer) -> None:
    gate = threading.Event()
    scripted.configure(summary_gate=gate, fail_next_summary=[("status", 503, "held then failed")])
    worker, result = _summary_in_thread(scripted)
    deadline = time.monotonic() + 5
    while scripted.fail_next_summary and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scripted.fail_next_summary == []  # taken when the request arrived
    assert worker.is_alive() and "resp" not in result  # still held at the gate
    gate.set()
    worker.join(10)
    status, _, raw = result["resp"]
    assert (status, json.loads(raw)["error"]["message"]) == (503, "held then failed")


def test_scripted_reset_restores_its_own_defaults() -> None:
    queued = [("status", 500)]
    with ScriptedLLMServer(fail_next_summary=queued, fail_all_summaries=("empty",), reply_text="hi") as server:
        server.configure(fail_all_summaries=None, reply_text="changed", summary_predicate=lambda body: True)
        server.fail_next_summary.clear()
        server.reset()
        assert server.fail_next_summary == [("status", 500)]
        assert server.fail_next_summary is not queued
        assert (server.fail_all_summaries, server.reply_text, server.summary_predicate) == (("empty",), "hi", None)


def _tool_calls_seen(api: str, stream: bool, raw: bytes) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The (name, arguments) calls and the stop reason of a tool-call response."""
    if api == "openai" and not stream:
        choice = json.loads(raw)["choices"][0]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in choice["message"]["tool_calls"]]
        return calls, choice["finish_reason"]
    if api == "openai":
        chunks = [json.loads(d) for d in _sse_data(raw) if d != "[DONE]"]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        calls = [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                 for d in deltas for t in d.get("tool_calls", [])]
        return calls, chunks[-1]["choices"][0]["finish_reason"]
    if not stream:
        message = json.loads(raw)
        return [(b["name"], b["input"]) for b in message["content"] if b["type"] == "tool_use"], message["stop_reason"]
    events = [json.loads(d) for d in _sse_data(raw)]
    names = [e["content_block"]["name"] for e in events
             if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    args = [json.loads(e["delta"]["partial_json"]) for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    stop = next(e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta")
    return list(zip(names, args, strict=True)), stop


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_tool_call_reply_is_rendered_for_each_api(scripted: ScriptedLLMServer, api: str, stream: bool) -> None:
    calls = [("session_search", {"query": "token"}), ("recall", {"query": "plan", "limit": 2})]
    scripted.reply_fn = lambda body: ToolCallReply(calls, text="looking")
    if api == "openai":
        url, body = f"{scripted.base_url}/chat/completions", _chat_body(stream=stream)
    else:
        url = f"{scripted.anthropic_base_url}/v1/messages"
        body = {"model": "m", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw = _request(url, body)
    assert status == 200
    assert _tool_calls_seen(api, stream, raw) == (calls, "tool_calls" if api == "openai" else "tool_use")
