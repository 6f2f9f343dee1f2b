"""Drive the real Hermes offline: a temporary home, a seeded session, one compression.

Used by ``selftest`` (in a subprocess with its own ``HERMES_HOME``) and by the
integration tests. Nothing here imports Hermes at module import time:
``HERMES_HOME`` must be set before the first Hermes import.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MESSAGE_CHARS = 14_000
SEED_MESSAGES = 48


def write_config(
    home: Path,
    base_url: str,
    *,
    plugin_enabled: bool = True,
    in_place: bool | None = None,
    session_guard: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A config.yaml pointing Hermes at the fake LLM (and enabling the guard)."""
    import yaml

    home.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {
        "model": {
            "default": "fake-model",
            "provider": "custom",
            "base_url": base_url,
            "api_key": "sk-fake",
            "context_length": 128000,
        },
        "plugins": {"enabled": ["session-guard"] if plugin_enabled else []},
    }
    if in_place is not None:
        cfg["compression"] = {"in_place": in_place}
    if session_guard is not None:
        cfg["session_guard"] = session_guard
    if extra:
        cfg.update(extra)
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def seed_messages(n: int = SEED_MESSAGES, chars: int = MESSAGE_CHARS, tag: str = "turn") -> list[dict[str, Any]]:
    """``n`` alternating user/assistant messages of ~``chars`` characters, each
    starting with a unique marker ``<tag>-<i>:`` so tests can find them."""
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        head = f"{tag}-{i}: "
        body = (f"{role} line {i} about the deployment plan. " * (chars // 40 + 1))[: max(0, chars - len(head))]
        out.append({"role": role, "content": head + body})
    return out


def discover_guard() -> Any:
    """Run Hermes's own plugin discovery (as the CLI and gateway do)."""
    from hermes_cli import plugins

    plugins.discover_plugins()
    return plugins.get_plugin_manager()


def open_db(path: Path) -> Any:
    from hermes_state import SessionDB

    return SessionDB(db_path=Path(path))


def make_agent(db: Any, base_url: str, session_id: str, *, platform: str = "cli", **kwargs: Any) -> Any:
    from run_agent import AIAgent

    params: dict[str, Any] = dict(
        base_url=base_url,
        api_key="sk-fake",
        provider="custom",
        model="fake-model",
        quiet_mode=True,
        skip_context_files=True,
        skip_memory=True,
        enabled_toolsets=[],
        session_db=db,
        platform=platform,
        session_id=session_id,
    )
    params.update(kwargs)
    return AIAgent(**params)


def seed_session(db: Any, session_id: str, messages: list[dict[str, Any]], source: str = "cli") -> None:
    db.create_session(session_id=session_id, source=source, model="fake-model")
    for m in messages:
        db.append_message(session_id=session_id, role=m["role"], content=m["content"])


def mark_flushed(agent: Any, messages: list[dict[str, Any]]) -> None:
    """Tell the agent these messages are already in state.db (as after a resumed turn)."""
    agent._session_db_created = True
    agent._last_flushed_db_idx = len(messages)
    if hasattr(agent, "_flushed_db_message_ids"):
        agent._flushed_db_message_ids = {id(m) for m in messages}
        agent._flushed_db_message_session_id = agent.session_id


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock2:
            self.records.append(record)


@contextmanager
def capture_host_compression_logs() -> Iterator[list[str]]:
    """Capture Hermes's own ``context compression started/done`` lines (rendered)."""
    cap = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(cap)
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    lines: list[str] = []
    try:
        yield lines
    finally:
        root.removeHandler(cap)
        root.setLevel(old_level)
        for rec in cap.records:
            msg = rec.getMessage()
            if "context compression" in msg:
                lines.append(msg)


def session_ids_in(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for token in line.split():
            if token.startswith("session="):
                out.append(token.split("=", 1)[1])
    return out


def sessions_table(db_path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(str(db_path))
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM sessions ORDER BY started_at")]
    finally:
        conn.close()


def live_messages(db_path: Path, session_id: str) -> list[dict[str, Any]]:
    """Messages Hermes would load for ``session_id`` (active rows where the host has them)."""
    conn = sqlite3.connect(str(db_path))
    conn.row_factory = sqlite3.Row
    try:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)")}
        where = "session_id = ?" + (" AND active = 1" if "active" in cols else "")
        return [dict(r) for r in conn.execute(f"SELECT * FROM messages WHERE {where} ORDER BY id", (session_id,))]
    finally:
        conn.close()


@dataclass
class ProbeResult:
    checks: list[dict[str, Any]] = field(default_factory=list)
    seams: list[dict[str, Any]] = field(default_factory=list)
    host_version: str | None = None

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "host_version": self.host_version, "seams": self.seams, "checks": self.checks}


def run_contract_probe(home: Path) -> ProbeResult:
    """The live probe: enable the guard through config.yaml, let Hermes discover it,
    compress a 48-message session once and check the contract. ``HERMES_HOME``
    must already point at ``home``."""
    from . import audit, current_runtime
    from .fake_llm import FakeLLMServer

    result = ProbeResult()
    with FakeLLMServer() as llm:
        write_config(home, llm.base_url, in_place=False)
        discover_guard()
        runtime = current_runtime()
        result.check("guard loaded by Hermes plugin discovery", runtime is not None)
        if runtime is None:
            return result
        result.host_version = runtime.host_version
        result.seams = [s.as_dict() for s in runtime.seams]
        result.check(
            "compression seam patched",
            any(s.name == "compression" and s.state == "patched" for s in runtime.seams),
            "; ".join(f"{s.name}: {s.state} {s.reason}" for s in runtime.seams),
        )
        db_path = home / "state.db"
        db = open_db(db_path)
        sid = "20260528_093510_66bfaec7"
        messages = seed_messages()
        seed_session(db, sid, messages)
        agent = make_agent(db, llm.base_url, sid)
        mark_flushed(agent, messages)
        env_before = os.environ.get("HERMES_SESSION_ID")
        with capture_host_compression_logs() as lines:
            compressed, _ = agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
        result.check("compression made progress", len(compressed) < len(messages),
                     f"{len(messages)} -> {len(compressed)}")
        result.check("agent.session_id unchanged", agent.session_id == sid, agent.session_id)
        result.check("HERMES_SESSION_ID unchanged", os.environ.get("HERMES_SESSION_ID") == env_before,
                     str(os.environ.get("HERMES_SESSION_ID")))
        ids = session_ids_in(lines)
        result.check("host log lines started/done name the same id", len(ids) >= 2 and set(ids) == {sid},
                     " | ".join(lines))
        rows = sessions_table(db_path)
        result.check("no child session created", [r["id"] for r in rows] == [sid],
                     ", ".join(r["id"] for r in rows))
        result.check("session not ended", rows[0]["ended_at"] is None if rows else False)
        live = live_messages(db_path, sid)
        result.check("live transcript is the compacted one", len(live) == len(compressed),
                     f"{len(live)} live rows, {len(compressed)} compacted")
        store = runtime.store_for(db_path)
        snaps = store.list_snapshots(sid)
        result.check(
            "pre-compression transcript kept as snapshot",
            len(snaps) == 1 and snaps[0].message_count == len(messages)
            and snaps[0].snapshot_id.startswith(f"{sid}.snapshot."),
            ", ".join(f"{s.snapshot_id} ({s.message_count})" for s in snaps),
        )
        events = [e for e in audit.read_events(runtime.audit_path) if e.get("op_id")]
        names = [e["event"] for e in events]
        result.check(
            "audit events name one session",
            "compression.started" in names and "compression.done" in names
            and {e["session_id"] for e in events} == {sid},
            ", ".join(names),
        )
        from .probe_gateway import check_buffered_delivery

        check_buffered_delivery(result, llm, runtime)
    return result


def main() -> int:
    """Entry for ``python -m hermes_session_guard.probe`` (run by ``selftest``)."""
    home = Path(os.environ["HERMES_HOME"])
    try:
        result = run_contract_probe(home)
        payload = result.as_dict()
    except Exception as exc:  # report, don't traceback: selftest prints it
        import traceback

        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                   "checks": [], "seams": []}
    print("SESSION_GUARD_PROBE " + json.dumps(payload))
    return 0 if payload.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
