"""A minimal state.db with the columns the operator commands read, built by plain SQL
(unit tests have no Hermes). Timestamps are explicit so every scenario is exact."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT, model_config TEXT,
    system_prompt TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL,
    end_reason TEXT, message_count INTEGER DEFAULT 0, title TEXT
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
    content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL,
    active INTEGER NOT NULL DEFAULT 1, compacted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE compression_locks (
    session_id TEXT PRIMARY KEY, holder TEXT NOT NULL, acquired_at REAL NOT NULL, expires_at REAL NOT NULL
);
CREATE TABLE gateway_routing (
    scope TEXT NOT NULL DEFAULT '', session_key TEXT NOT NULL, entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (scope, session_key)
);
"""

SUMMARY = "[CONTEXT COMPACTION — REFERENCE ONLY] Earlier turns were compacted into the summary below."


class HermesLikeHome:
    def __init__(self, home: Path, schema_version: int = 22) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n", encoding="utf-8")
        self.db_path = home / "state.db"
        self.conn = sqlite3.connect(str(self.db_path), isolation_level=None)
        self.conn.executescript(SCHEMA)
        self.conn.execute("INSERT INTO schema_version VALUES (?)", (schema_version,))

    def session(self, sid: str, started: float, *, parent: str | None = None, ended: float | None = None,
                reason: str | None = None, source: str = "telegram", model_config: dict[str, Any] | None = None
                ) -> str:
        self.conn.execute(
            "INSERT INTO sessions(id, source, parent_session_id, started_at, ended_at, end_reason, model_config)"
            " VALUES (?,?,?,?,?,?,?)",
            (sid, source, parent, started, ended, reason, json.dumps(model_config) if model_config else None),
        )
        return sid

    def messages(self, sid: str, contents: list[str], ts: float, *, active: int = 1) -> list[int]:
        ids = []
        for i, content in enumerate(contents):
            role = "user" if i % 2 == 0 else "assistant"
            cur = self.conn.execute(
                "INSERT INTO messages(session_id, role, content, timestamp, active) VALUES (?,?,?,?,?)",
                (sid, role, content, ts + i * 0.001, active),
            )
            ids.append(int(cur.lastrowid))
        return ids

    def lock(self, sid: str, holder: str, acquired: float, expires: float) -> None:
        self.conn.execute("INSERT INTO compression_locks VALUES (?,?,?,?)", (sid, holder, acquired, expires))

    def route(self, key: str, sid: str, *, table: bool = True, file: bool = True) -> None:
        entry = {"session_key": key, "session_id": sid}
        if table:
            self.conn.execute("INSERT OR REPLACE INTO gateway_routing VALUES (?,?,?,?)",
                              (str(self.home / "sessions"), key, json.dumps(entry), 1.0))
        if file:
            path = self.home / "sessions" / "sessions.json"
            path.parent.mkdir(exist_ok=True)
            data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"_README": "mirror"}
            data[key] = entry
            path.write_text(json.dumps(data), encoding="utf-8")

    def close(self) -> None:
        self.conn.close()


def rotated_home(home: Path) -> tuple[HermesLikeHome, dict[str, str]]:
    """Root R ended by compression at t=100 with two continuations (a fork); child A
    compressed again into A2; R got two rows after its end; routing points at B.
    Roles alternate user/assistant by position, so copies keep their position's parity."""
    h = HermesLikeHome(home)
    ids = {"R": "r", "A": "a", "B": "b", "A2": "a2"}
    h.session("r", 1.0, ended=100.0, reason="compression")
    h.messages("r", [f"r{i}" for i in range(6)], 10.0)
    h.session("a", 100.0, parent="r", ended=200.0, reason="compression")
    h.messages("a", ["r0", SUMMARY + " a", "r4", "r5", "a-q", "a-answer"], 100.5)
    h.session("b", 100.2, parent="r")
    h.messages("b", ["r0", SUMMARY + " b", "r4", "r5", "b-q", "b-answer"], 100.6)
    h.messages("r", ["late-q", "late-answer"], 150.0)
    h.session("a2", 200.0, parent="a")
    h.messages("a2", ["r0", SUMMARY + " a2", "a-q", "a-answer", "a2-q", "a2-answer"], 200.5)
    h.route("agent:main:telegram:dm:1", "b")
    return h, ids
