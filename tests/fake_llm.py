"""The tests' fake LLM: the package's ``FakeLLMServer`` plus what only tests script:
the Anthropic Messages API (``POST /v1/messages``, JSON and SSE, at ``anthropic_base_url``)
and the settings below.

``ScriptedLLMServer`` adds, as constructor options and ``configure``/``reset`` settings:

* ``models``: the model ids ``GET /v1/models`` lists (``["fake-model"]``);
* ``context_length``: a window each listed model reports (``context_length``, ``max_model_len``);
* ``summary_predicate(body) -> bool``: which LLM requests are summary calls (default:
  the package's summary markers, in the messages or the Anthropic ``system`` field);
* ``fail_next_summary``: a list of failure specs, one popped per summary request;
* ``fail_all_summaries``: a failure spec for every summary request while the list is empty.

A failure spec is a name or a tuple ``(name, arg, ...)``:

* ``("status", code[, message])``: an error response in the request's wire format (500);
* ``("timeout", seconds)``: no response, the connection closes after ``seconds`` (30);
* ``("garbage", nbytes)``: a 200 with ``nbytes`` of invalid UTF-8 as the body (1024);
* ``("empty",)``: an empty summary text;
* ``("huge", nchars)``: a summary text of ``nchars`` characters (1,000,000).

The spec is taken when the summary request arrives (before the strict check, the
summary latency and the gate, as ``summary_started`` is set) and applied after them.

A ``reply_fn`` may return a ``ToolCallReply`` to make the model call tools instead of
answering; it is rendered for both APIs, streamed or not.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from hermes_session_guard.selftest.fake_llm import (
    STREAM_CHUNK_CHARS,
    SUMMARY_MARKERS,
    FakeLLMHandler,
    FakeLLMServer,
    RequestKind,
    iter_message_text,
)

__all__ = ["FailureSpec", "ScriptedLLMServer", "ToolCallReply"]

FailureSpec = tuple[Any, ...]

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}

_GARBAGE_PATTERN = bytes([0xFF, 0xFE, 0xC3, 0x28, 0xA0, 0xA1, 0xE2, 0x28, 0xA1, 0x80])


@dataclass(frozen=True)
class ToolCallReply:
    """What a ``reply_fn`` returns to make the model call tools instead of answering:
    ``calls`` is a list of ``(tool_name, arguments_dict)``; ``text`` optional prose."""

    calls: list[tuple[str, dict[str, Any]]]
    text: str = ""

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for name, args in self.calls
        ]

    def anthropic_blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": self.text}] if self.text else []
        blocks += [
            {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": name, "input": args}
            for name, args in self.calls
        ]
        return blocks


def _normalize_spec(spec: Any) -> FailureSpec:
    if isinstance(spec, str):
        return (spec,)
    if isinstance(spec, (tuple, list)) and spec:
        return tuple(spec)
    raise ValueError(f"invalid failure spec: {spec!r}")


class _ScriptedHandler(FakeLLMHandler):
    API_PATHS = {**FakeLLMHandler.API_PATHS, "/v1/messages": "anthropic", "/messages": "anthropic"}
    _failure: FailureSpec | None = None

    def _send_error(self, status: int, message: str, api: str) -> None:
        if api != "anthropic":
            super()._send_error(status, message, api)
            return
        etype = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        self._send_json(status, {"type": "error", "error": {"type": etype, "message": message}})

    def _handle_llm(self, api: str, path: str, body: dict[str, Any], raw: bytes, kind: RequestKind) -> None:
        fake = cast(ScriptedLLMServer, self.server.fake)
        if kind == "summary":
            fake.summary_started.set()  # as the package's handler does, before the failure is taken
            self._failure = fake._take_failure()
        super()._handle_llm(api, path, body, raw, kind)

    def _reply_to(self, api: str, kind: RequestKind, body: dict[str, Any]) -> object:
        failure = self._failure
        if failure is None:
            return super()._reply_to(api, kind, body)
        name = str(failure[0])
        arg = failure[1] if len(failure) > 1 else None
        if name == "status":
            status = int(arg) if arg is not None else 500
            message = str(failure[2]) if len(failure) > 2 else f"Injected summary failure (HTTP {status})"
            self._send_error(status, message, api)
            return None
        if name == "timeout":
            self.server.fake._sleep(float(arg) if arg is not None else 30.0)
            self.close_connection = True
            return None
        if name == "garbage":
            nbytes = int(arg) if arg is not None else 1024
            reps = nbytes // len(_GARBAGE_PATTERN) + 1
            self._send_bytes(200, (_GARBAGE_PATTERN * reps)[:nbytes])
            return None
        if name == "empty":
            return ""
        if name == "huge":
            nchars = int(arg) if arg is not None else 1_000_000
            return ("lorem ipsum " * (nchars // 12 + 1))[:nchars]
        self._send_error(500, f"Unknown failure spec: {failure!r}", api)
        return None

    def _send_reply(self, api: str, stream: bool, model: str, reply: object, raw: bytes,
                    body: dict[str, Any]) -> None:
        if not isinstance(reply, ToolCallReply):
            if api != "anthropic":
                super()._send_reply(api, stream, model, reply, raw, body)
                return
            text = str(reply)
            prompt, completion = self.server.fake._usage(raw)
            (self._anthropic_stream if stream else self._anthropic_json)(model, text, prompt, completion)
            return
        prompt_tokens, completion_tokens = self.server.fake._usage(raw)
        if api == "openai":
            self._openai_tool_calls(stream, model, reply, prompt_tokens, completion_tokens, body)
        else:
            self._anthropic_tool_calls(stream, model, reply, prompt_tokens, completion_tokens)

    def _openai_tool_calls(self, stream: bool, model: str, reply: ToolCallReply, prompt_tokens: int,
                           completion_tokens: int, body: dict[str, Any]) -> None:
        calls = reply.openai_tool_calls()
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if not stream:
            self._send_json(200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "logprobs": None, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": reply.text or None,
                                         "tool_calls": calls, "refusal": None}}],
                "usage": usage, "system_fingerprint": None,
            })
            return
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            obj: dict[str, Any] = {"id": chunk_id, "object": "chat.completion.chunk", "created": int(time.time()),
                                   "model": model, "system_fingerprint": None,
                                   "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                "finish_reason": finish}]}
            if finish and include_usage is not False:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n"

        self._start_stream()
        self._write(chunk({"role": "assistant", "content": reply.text or None}, None))
        for i, call in enumerate(calls):
            self._write(chunk({"tool_calls": [{"index": i, **call}]}, None))
        self._write(chunk({}, "tool_calls"))
        self._write(b"data: [DONE]\n\n")

    def _anthropic_tool_calls(self, stream: bool, model: str, reply: ToolCallReply, prompt_tokens: int,
                              completion_tokens: int) -> None:
        blocks = reply.anthropic_blocks()
        message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
                   "stop_reason": "tool_use", "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}}
        if not stream:
            self._send_json(200, {**message, "content": blocks})
            return

        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        self._start_stream()
        self._write(event("message_start", {"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}
        }}))
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                self._write(event("content_block_start", {"type": "content_block_start", "index": i,
                                                          "content_block": {"type": "text", "text": ""}}))
                self._write(event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                          "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                start = {**block, "input": {}}
                self._write(event("content_block_start", {"type": "content_block_start", "index": i,
                                                          "content_block": start}))
                self._write(event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
            self._write(event("content_block_stop", {"type": "content_block_stop", "index": i}))
        self._write(event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                            "usage": {"output_tokens": completion_tokens}}))
        self._write(event("message_stop", {"type": "message_stop"}))

    def _anthropic_json(self, model: str, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._send_json(200, {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
        })

    def _anthropic_stream(self, model: str, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        self._start_stream()
        message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
        self._write(event("message_start", {"type": "message_start", "message": message}))
        self._write(event("content_block_start", {"type": "content_block_start", "index": 0,
                                                  "content_block": {"type": "text", "text": ""}}))
        for piece in [text[i : i + STREAM_CHUNK_CHARS] for i in range(0, len(text), STREAM_CHUNK_CHARS)]:
            self._write(event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                      "delta": {"type": "text_delta", "text": piece}}))
        self._write(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        self._write(event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                            "usage": {"input_tokens": prompt_tokens,
                                                      "output_tokens": completion_tokens}}))
        self._write(event("message_stop", {"type": "message_stop"}))


class ScriptedLLMServer(FakeLLMServer):
    """``FakeLLMServer`` with the Anthropic API, ``models``, ``context_length``, ``summary_predicate``,
    ``fail_next_summary``, ``fail_all_summaries``, ``ToolCallReply`` replies (see the module docstring)
    and ``running``."""

    handler_class = _ScriptedHandler
    MESSAGE_KEYS = {**FakeLLMServer.MESSAGE_KEYS, "anthropic": frozenset({"role", "content"})}

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def __init__(
        self,
        *,
        models: list[str] | None = None,
        context_length: int | None = None,
        summary_predicate: Callable[[dict[str, Any]], bool] | None = None,
        fail_next_summary: list[Any] | None = None,
        fail_all_summaries: FailureSpec | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._defaults.update(models=models, context_length=context_length, summary_predicate=summary_predicate,
                              fail_next_summary=fail_next_summary, fail_all_summaries=fail_all_summaries)
        self.models = list(models) if models is not None else ["fake-model"]
        self.context_length = context_length
        self.summary_predicate = summary_predicate
        self.fail_next_summary: list[Any] = list(fail_next_summary or [])
        self.fail_all_summaries = fail_all_summaries

    def reset(self, *, behaviour: bool = True) -> None:
        with self._lock:
            super().reset(behaviour=behaviour)
            if behaviour:
                self.fail_next_summary = list(self._defaults["fail_next_summary"] or [])
                self.models = list(self._defaults["models"] or ["fake-model"])

    def classify(self, body: dict[str, Any]) -> RequestKind:
        predicate = self.summary_predicate
        if predicate is None:
            system = iter_message_text(body.get("system"))
            return "summary" if any(m in text for text in system for m in SUMMARY_MARKERS) else super().classify(body)
        return "summary" if predicate(body) else "chat"

    def _model_object(self, model_id: str) -> dict[str, Any]:
        obj = super()._model_object(model_id)
        if self.context_length is not None:
            obj["context_length"] = obj["max_model_len"] = self.context_length
        return obj

    def _take_failure(self) -> FailureSpec | None:
        with self._lock:
            if self.fail_next_summary:
                return _normalize_spec(self.fail_next_summary.pop(0))
            if self.fail_all_summaries is not None:
                return _normalize_spec(self.fail_all_summaries)
        return None

    def _reply_for(self, kind: RequestKind, body: dict[str, Any]) -> object:
        # a chat reply_fn may return a ToolCallReply, which the handler renders as tool calls
        fn: Callable[[dict[str, Any]], Any] | None = self.reply_fn
        if kind == "chat" and fn is not None:
            reply = fn(body)
            return reply if isinstance(reply, ToolCallReply) else str(reply)
        return super()._reply_for(kind, body)
