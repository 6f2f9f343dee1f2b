"""host.live_brief: a session's live rows as stored (role, content, tool_call_id), read
without Hermes's loader, for comparisons by key; and the compression's use of it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.host import reads


def _db(tmp_path: Path, *, active: bool = True, metadata: bool = True) -> Path:
    path = tmp_path / "state.db"
    cols = ["id INTEGER PRIMARY KEY", "session_id TEXT", "role TEXT", "content TEXT", "tool_call_id TEXT"]
    cols += ["active INTEGER DEFAULT 1"] if active else []
    cols += ["display_metadata TEXT"] if metadata else []
    conn = sqlite3.connect(path)
    conn.execute(f"CREATE TABLE messages ({', '.join(cols)})")
    conn.commit()
    conn.close()
    return path


def _add(path: Path, sid: str, role: str, content: str | None, **extra: Any) -> int:
    conn = sqlite3.connect(path)
    keys = ["session_id", "role", "content", *extra]
    cur = conn.execute(f"INSERT INTO messages ({', '.join(keys)}) VALUES ({', '.join('?' for _ in keys)})",
                       (sid, role, content, *extra.values()))
    conn.commit()
    conn.close()
    return int(cur.lastrowid or 0)


def _agent(path: Path | None) -> Any:
    return SimpleNamespace(session_id="S1", _session_db=SimpleNamespace(db_path=str(path) if path else None))


@pytest.fixture(autouse=True)
def _fresh_readers() -> Any:
    yield
    reads.close_readers()


def test_live_rows_in_order_without_metadata_inactive_or_left_out_rows(tmp_path: Path) -> None:
    path = _db(tmp_path)
    _add(path, "S1", "session_meta", "{}")
    _add(path, "S1", "user", "u1")
    _add(path, "S1", "user", "old", active=0)
    _add(path, "S1", "assistant", "a1")
    _add(path, "S1", "tool", "r", tool_call_id="c1")
    staged = _add(path, "S1", "user", "u2")
    _add(path, "S2", "user", "other session")
    brief = host.live_brief(_agent(path), "S1", leave_out_row=staged)
    assert brief == [{"role": "user", "content": "u1", "tool_call_id": None},
                     {"role": "assistant", "content": "a1", "tool_call_id": None},
                     {"role": "tool", "content": "r", "tool_call_id": "c1"}]


def test_a_display_marker_is_decoded_and_an_undecodable_one_means_read_the_transcript(tmp_path: Path) -> None:
    path = _db(tmp_path)
    _add(path, "S1", "user", "u1", display_metadata=json.dumps({"kind": "x"}))
    assert host.live_brief(_agent(path), "S1") == [
        {"role": "user", "content": "u1", "tool_call_id": None, "display_metadata": {"kind": "x"}}]
    _add(path, "S1", "user", "u2", display_metadata="{not json")
    assert host.live_brief(_agent(path), "S1") is None


def test_releases_without_active_or_display_columns_read_every_row(tmp_path: Path) -> None:
    path = _db(tmp_path, active=False, metadata=False)
    _add(path, "S1", "user", "u1")
    assert [m["content"] for m in host.live_brief(_agent(path), "S1") or []] == ["u1"]


def test_no_file_of_its_own_or_a_failed_read_is_none_never_another_database(tmp_path: Path) -> None:
    assert host.live_brief(_agent(None), "S1") is None  # never $HERMES_HOME/state.db by default
    assert host.live_brief(_agent(tmp_path / "missing.db"), "S1") is None
    assert host.live_brief(SimpleNamespace(session_id="S1", _session_db=None), "S1") == []


def test_a_column_hermes_adds_while_the_reader_is_open_is_seen(tmp_path: Path) -> None:
    # the reader keeps the table's columns until the schema changes (Hermes migrates on open)
    path = _db(tmp_path, active=False, metadata=False)
    _add(path, "S1", "user", "u1")
    assert [m["content"] for m in host.live_brief(_agent(path), "S1") or []] == ["u1"]
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE messages ADD COLUMN active INTEGER DEFAULT 1")
    conn.commit()
    conn.close()
    _add(path, "S1", "user", "archived", active=0)
    assert [m["content"] for m in host.live_brief(_agent(path), "S1") or []] == ["u1"]


def test_one_read_gives_the_brief_and_every_live_row_id_as_live_row_ranges_does(tmp_path: Path) -> None:
    path = _db(tmp_path)
    _add(path, "S1", "session_meta", "{}")
    _add(path, "S1", "user", "u1")
    _add(path, "S1", "user", "old", active=0)
    _add(path, "S1", "assistant", "a1")
    _add(path, "S1", "system", "injected")
    _add(path, "S2", "user", "other session")
    brief, runs = host.live_brief_and_runs(_agent(path), "S1")
    assert [(m["_row_id"], m["content"]) for m in brief or []] == [(2, "u1"), (4, "a1")]
    assert runs == host.live_row_ranges(path, "S1") == [(1, 2), (4, 5)]  # metadata rows too
    _add(path, "S1", "user", "u2", display_metadata="{not json")
    assert host.live_brief_and_runs(_agent(path), "S1") == (None, [(1, 2), (4, 5), (7, 7)])
    assert host.live_brief_and_runs(_agent(tmp_path / "missing.db"), "S1") == (None, [])
