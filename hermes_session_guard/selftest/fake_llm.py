"""Loopback fake LLM server speaking the OpenAI HTTP API.

The server binds ``127.0.0.1`` on an ephemeral port and answers:

* ``GET /v1/models`` and ``GET /v1/models/<id>``
* ``POST /v1/chat/completions`` (JSON and ``stream: true`` SSE)

Any other GET or POST path gets a 404 JSON error (other methods http.server's 501,
unrecorded: no client of the server sends them). Every request is recorded and classified
as a context-compression ``"summary"`` call, an ordinary ``"chat"`` call, or
``"other"`` (model listings, unknown paths, unparsable bodies).

Responses are HTTP/1.0 style: non-stream bodies carry ``Content-Length`` and
every response is sent with ``Connection: close``, so clients never wait on a
half-open keep-alive connection.

It is one self-contained HTTP server (handler, both wire formats, streaming, the
request log) that the self-test, the demo and the benchmarks start the same way. What
only the tests need (injected summary failures, tool-call replies) lives in the tests,
in a subclass: ``FakeLLMServer.handler_class`` names the request handler the server
builds, whose ``_reply_to`` may answer a request itself and whose ``_send_reply`` may
render a reply that is not text; ``FakeLLMServer.classify`` may be overridden too.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urlsplit

from ..fail_open import failing_open

__all__ = [
    "DEFAULT_SUMMARY_TEXT",
    "OPENAI_MESSAGE_KEYS",
    "SUMMARY_MARKERS",
    "FakeLLMHandler",
    "FakeLLMServer",
    "RequestRecord",
    "contains_summary_marker",
    "iter_message_text",
]

SUMMARY_MARKERS: tuple[str, ...] = (
    "Create a structured handoff summary",
    "summarize",
    "Summarize",
    "CONTEXT CHECKPOINT",
    "handoff summary",
    "TURNS TO SUMMARIZE",
    "conversation turns to summarize",
    # Hermes's iterative update of an earlier summary carries none of the above
    "You are a summarization agent",
    "NEW TURNS TO INCORPORATE",
)

OPENAI_MESSAGE_KEYS: frozenset[str] = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal"}
)

DEFAULT_SUMMARY_TEXT = (
    "## Goal\n"
    "Continue the user's task.\n\n"
    "## Progress\n"
    "- Earlier turns were compressed by the fake LLM server.\n\n"
    "## Key Decisions\n"
    "- None recorded.\n\n"
    "## Next Steps\n"
    "- Resume from the latest user message.\n"
)

GATE_TIMEOUT_SECONDS = 60.0
STREAM_CHUNK_CHARS = 8  # characters of reply text per streamed chunk (SSE delta)
COMPLETION_TOKENS = 10  # the usage every reply reports for its completion

RequestKind = Literal["summary", "chat", "other"]

_MODELS_PATHS = frozenset({"/v1/models", "/models"})
_MODEL_PREFIXES = ("/v1/models/", "/models/")

_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}

@dataclass(frozen=True)
class RequestRecord:
    """One request received by the fake server.

    ``headers`` keys are lower-cased. ``kind`` is ``"other"`` for requests
    that are not LLM calls (model listings, unknown paths, invalid JSON).
    """

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    ts: float
    kind: RequestKind


def iter_message_text(value: Any) -> Iterator[str]:
    """Yield every text fragment in a message ``content`` value.

    Handles plain strings, lists of OpenAI/Anthropic content parts, and
    nested ``content`` (e.g. Anthropic ``tool_result`` blocks).
    """
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from iter_message_text(item)
    elif isinstance(value, dict):
        text = value.get("text")
        if isinstance(text, str):
            yield text
        if "content" in value:
            yield from iter_message_text(value["content"])


def contains_summary_marker(body: dict[str, Any]) -> bool:
    """Return True if any message content has a marker (the tests' Anthropic server also
    looks at the ``system`` field)."""
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        marker in text for m in messages if isinstance(m, dict)
        for text in iter_message_text(m.get("content")) for marker in SUMMARY_MARKERS
    )


def _chunk_text(text: str) -> list[str]:
    return [text[i : i + STREAM_CHUNK_CHARS] for i in range(0, len(text), STREAM_CHUNK_CHARS)]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fake: FakeLLMServer) -> None:
        super().__init__(("127.0.0.1", 0), fake.handler_class)
        self.fake = fake

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class FakeLLMHandler(BaseHTTPRequestHandler):
    """Answers one request for ``self.server.fake``; a subclass named by a server's
    ``handler_class`` may override ``_reply_to`` and ``_send_reply``."""

    server: _HTTPServer
    API_PATHS: ClassVar[dict[str, str]] = {"/v1/chat/completions": "openai", "/chat/completions": "openai"}
    protocol_version = "HTTP/1.0"
    server_version = "FakeLLM/1.0"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    # -- plumbing ---------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_bytes(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_json(self, status: int, payload: Any) -> None:
        self._send_bytes(status, json.dumps(payload).encode("utf-8"))

    def _send_error(self, status: int, message: str, api: str) -> None:
        default = "server_error" if status >= 500 else "invalid_request_error"
        self._send_json(status, {"error": {"message": message, "type": _OPENAI_ERROR_TYPES.get(status, default)}})

    def _start_stream(self) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    # -- routing ----------------------------------------------------------

    def _handle(self, method: str) -> None:
        fake = self.server.fake
        path = urlsplit(self.path).path
        if len(path) > 1:
            path = path.rstrip("/")
        raw = self._read_body() if method == "POST" else b""
        headers = {k.lower(): v for k, v in self.headers.items()}

        api = self.API_PATHS.get(path) if method == "POST" else None

        body: dict[str, Any] = {}
        invalid_json = False
        if raw:
            try:
                parsed = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                parsed = None
            if isinstance(parsed, dict):
                body = parsed
            else:
                invalid_json = True

        kind: RequestKind = "other"
        if api is not None and not invalid_json:
            kind = fake.classify(body)
        fake._record(RequestRecord(path=path, body=body, headers=headers, ts=time.time(), kind=kind))

        if fake._sleep(fake.latency):
            return

        if method == "GET" and path in _MODELS_PATHS:
            self._send_json(200, fake._models_payload())
            return
        if method == "GET" and path.startswith(_MODEL_PREFIXES):
            model_id = unquote(path.split("/models/", 1)[1])
            obj = fake._model_object(model_id) if model_id in fake.models else None
            if obj is None:
                self._send_error(404, f"The model '{model_id}' does not exist", "openai")
            else:
                self._send_json(200, obj)
            return
        if api is None:
            self._send_error(404, f"Unknown path: {method} {path}", "openai")
            return
        if invalid_json:
            self._send_error(400, "Request body is not a JSON object", api)
            return
        self._handle_llm(api, path, body, raw, kind)

    def _handle_llm(self, api: str, path: str, body: dict[str, Any], raw: bytes, kind: RequestKind) -> None:
        fake = self.server.fake
        if kind == "summary":
            fake.summary_started.set()

        violation = fake._check_strict(api, path, body)
        if violation is not None:
            index, key = violation
            self._send_error(400, f"Extra inputs are not permitted: messages[{index}].{key}", api)
            return

        if kind == "summary":
            if fake._sleep(fake.summary_latency) or not fake._wait_gate():
                return

        reply = self._reply_to(api, kind, body)
        if reply is None:
            return
        model = str(body.get("model") or (fake.models[0] if fake.models else "fake-model"))
        self._send_reply(api, bool(body.get("stream")), model, reply, raw, body)

    def _reply_to(self, api: str, kind: RequestKind, body: dict[str, Any]) -> object:
        """The reply to an LLM request that passed the strict check, latency and gate, for
        ``_send_reply``; None when the request was answered here (a failing reply function
        gets a 500). A subclass may answer a request itself before the normal reply."""
        with failing_open("the fake LLM's reply function", "the request gets a 500", level=None) as failed:
            reply = self.server.fake._reply_for(kind, body)
        if failed.exc is None:
            return reply
        self._send_error(500, f"reply function failed: {failed.exc!r}", api)
        return None

    def _send_reply(self, api: str, stream: bool, model: str, reply: object, raw: bytes,
                    body: dict[str, Any]) -> None:
        """Send ``reply`` as the assistant's text in ``api``'s wire format; a subclass may
        render other replies (``raw`` is the request body as received, for the usage)."""
        text = str(reply)
        prompt_tokens, completion_tokens = self.server.fake._usage(raw)
        if stream:
            include_usage = (body.get("stream_options") or {}).get("include_usage")
            self._openai_stream(model, text, prompt_tokens, completion_tokens, include_usage)
        else:
            self._openai_json(model, text, prompt_tokens, completion_tokens)

    # -- OpenAI -----------------------------------------------------------

    def _openai_json(self, model: str, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "system_fingerprint": None,
        }
        self._send_json(200, payload)

    def _openai_stream(
        self,
        model: str,
        text: str,
        prompt_tokens: int,
        completion_tokens: int,
        include_usage: Any,
    ) -> None:
        chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

        def chunk(delta: dict[str, Any], finish: str | None, with_usage: bool = False) -> bytes:
            obj: dict[str, Any] = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if with_usage:
                obj["usage"] = usage
            elif include_usage:
                obj["usage"] = None
            return b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n"

        self._start_stream()
        self._write(chunk({"role": "assistant", "content": ""}, None))
        for piece in _chunk_text(text):
            self._write(chunk({"content": piece}, None))
        self._write(chunk({}, "stop", with_usage=include_usage is not False))
        if include_usage:
            final = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [],
                "usage": usage,
            }
            self._write(b"data: " + json.dumps(final).encode("utf-8") + b"\n\n")
        self._write(b"data: [DONE]\n\n")


class FakeLLMServer:
    """Loopback OpenAI-compatible fake LLM server (the tests add the Anthropic API).

    Behaviour attributes may be reassigned at any time, including while the
    server runs; ``configure(**kwargs)`` does the same under the lock. What
    ``reply_fn`` and ``summary_fn`` return is sent as its ``str()``.
    """

    handler_class: ClassVar[type[FakeLLMHandler]] = FakeLLMHandler
    MESSAGE_KEYS: ClassVar[dict[str, frozenset[str]]] = {"openai": OPENAI_MESSAGE_KEYS}  # strict mode's allowed keys

    def __init__(
        self,
        *,
        reply_text: str = "OK.",
        reply_fn: Callable[[dict[str, Any]], str] | None = None,
        summary_text: str = DEFAULT_SUMMARY_TEXT,
        summary_fn: Callable[[dict[str, Any]], str] | None = None,
        latency: float = 0.0,
        summary_latency: float = 0.0,
        summary_gate: threading.Event | None = None,
        gate_timeout: float = GATE_TIMEOUT_SECONDS,
        prompt_tokens: int | None = None,
        strict: bool = False,
    ) -> None:
        self._defaults = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.models: list[str] = ["fake-model"]  # what GET /v1/models lists
        self.reply_text = reply_text
        self.reply_fn = reply_fn
        self.summary_text = summary_text
        self.summary_fn = summary_fn
        self.latency = latency
        self.summary_latency = summary_latency
        self.summary_gate = summary_gate
        self.gate_timeout = gate_timeout
        self.summary_started = threading.Event()
        self.prompt_tokens = prompt_tokens
        self.strict = strict

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._requests: list[RequestRecord] = []
        self._violations: list[tuple[str, int, str]] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> FakeLLMServer:
        with self._lock:
            if self._httpd is not None:
                raise RuntimeError("FakeLLMServer is already running")
            self._stopping.clear()
            httpd = _HTTPServer(self)
            self._httpd = httpd
            self._port = int(httpd.server_address[1])
            self._thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"FakeLLMServer:{self._port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = None
            self._thread = None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeLLMServer has not been started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- configuration ----------------------------------------------------

    def configure(self, **kwargs: Any) -> None:
        """Set several behaviour attributes atomically."""
        with self._lock:
            for name, value in kwargs.items():
                if name.startswith("_") or not hasattr(self, name):
                    raise AttributeError(f"unknown FakeLLMServer setting: {name}")
                setattr(self, name, value)

    def classify(self, body: dict[str, Any]) -> RequestKind:
        """Return ``"summary"`` or ``"chat"`` for an LLM request body."""
        return "summary" if contains_summary_marker(body) else "chat"

    # -- recorded traffic -------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """Snapshot copy of all recorded requests, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def violations(self) -> list[tuple[str, int, str]]:
        """Snapshot copy of strict-mode violations as ``(path, index, key)``."""
        with self._lock:
            return list(self._violations)

    def chat_requests(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.kind == "chat"]

    def summary_requests(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.kind == "summary"]

    def wait_for_requests(self, count: int, kind: RequestKind | None = None, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` requests (of ``kind``, if given) were recorded."""
        deadline = time.monotonic() + timeout

        def enough() -> bool:
            return sum(1 for r in self._requests if kind is None or r.kind == kind) >= count

        with self._cond:
            while not enough():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def reset(self, *, behaviour: bool = True) -> None:
        """Forget recorded requests and violations and clear ``summary_started``;
        with ``behaviour`` (the default) also restore the constructor's settings."""
        with self._lock:
            if behaviour:
                for name, value in self._defaults.items():
                    setattr(self, name, value)
            self._requests.clear()
            self._violations.clear()
            self.summary_started.clear()

    # -- internals used by the handler ------------------------------------

    def _record(self, record: RequestRecord) -> None:
        with self._cond:
            self._requests.append(record)
            self._cond.notify_all()

    def _sleep(self, seconds: float | None) -> bool:
        """Sleep unless the server stops first; return True if stopping."""
        if seconds and seconds > 0:
            return self._stopping.wait(seconds)
        return self._stopping.is_set()

    def _wait_gate(self) -> bool:
        """Wait for ``summary_gate``; return False if the server is stopping."""
        gate = self.summary_gate
        if gate is None:
            return not self._stopping.is_set()
        deadline = time.monotonic() + self.gate_timeout
        while not gate.is_set():
            if self._stopping.is_set():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            gate.wait(min(0.05, remaining))
        return not self._stopping.is_set()

    def _check_strict(self, api: str, path: str, body: dict[str, Any]) -> tuple[int, str] | None:
        if not self.strict:
            return None
        allowed = self.MESSAGE_KEYS[api]
        messages = body.get("messages")
        found: list[tuple[int, str]] = []
        if isinstance(messages, list):
            for index, message in enumerate(messages):
                if isinstance(message, dict):
                    found.extend((index, key) for key in sorted(message) if key not in allowed)
        if not found:
            return None
        with self._lock:
            self._violations.extend((path, index, key) for index, key in found)
        return found[0]

    def _reply_for(self, kind: RequestKind, body: dict[str, Any]) -> object:
        """The reply for the handler's ``_send_reply``: text here; a subclass may return
        other replies that its handler renders."""
        if kind == "summary":
            return self.summary_text if self.summary_fn is None else str(self.summary_fn(body))
        return self.reply_text if self.reply_fn is None else str(self.reply_fn(body))

    def _usage(self, raw: bytes) -> tuple[int, int]:
        prompt = self.prompt_tokens if isinstance(self.prompt_tokens, int) else max(1, len(raw) // 4)
        return prompt, COMPLETION_TOKENS

    def _model_object(self, model_id: str) -> dict[str, Any]:
        created = int(time.time())
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": "fake-llm",
            "type": "model",
            "display_name": model_id,
            "created_at": datetime.fromtimestamp(created, tz=UTC).isoformat().replace("+00:00", "Z"),
        }

    def _models_payload(self) -> dict[str, Any]:
        ids = list(self.models)
        return {
            "object": "list",
            "data": [self._model_object(m) for m in ids],
            "has_more": False,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
        }
