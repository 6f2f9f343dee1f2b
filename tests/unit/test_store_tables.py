"""The store package names only the guard's own tables in its SQL: never one of
Hermes's (``sessions``, ``messages``, its FTS tables, ``state_meta``, ...)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import hermes_session_guard.store as store_pkg
from hermes_session_guard.store import GuardStore

STORE_DIR = Path(store_pkg.__file__).parent

# Every table Hermes's state.db holds in the supported releases (hermes_state.py).
HERMES_TABLES = {
    "sessions",
    "messages",
    "messages_fts",
    "messages_fts_trigram",
    "state_meta",
    "schema_version",
    "compression_locks",
    "gateway_routing",
    "async_delegations",
    "session_model_usage",
    "telegram_dm_topic_bindings",
    "telegram_dm_topic_mode",
}

# Names that are not the guard's tables but are allowed, each for a stated reason.
ALLOWED = {
    "sqlite_master": "SQLite's catalogue: whether a guard table exists yet",
    "t": "porter_stems' scratch FTS5 table in a private :memory: database",
    "v": "porter_stems' scratch fts5vocab table in the same :memory: database",
    "{}": "clear_expired_lock/clear_lock_of: a caller-named table, refused unless it is session_guard_*",
}

_SQL_START = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|BEGIN|COMMIT|ROLLBACK|WITH)\b", re.I)
_TABLE_REF = re.compile(
    r"\b(?:(?:FROM|JOIN|INTO|UPDATE|(?:TABLE|VIEW)(?:\s+IF\s+NOT\s+EXISTS)?)\s+(?:temp\.|main\.)?([A-Za-z_{}][\w{}]*)"
    r"|ON\s+([A-Za-z_]\w*)\s*\(|fts5vocab\s*\(\s*(?:main\s*,\s*)?([A-Za-z_]\w*))",
    re.I,
)
_QUOTED = re.compile(r"'[^']*'")


def _strings(tree: ast.AST) -> list[str]:
    """String constants and f-strings (placeholders as ``{}``), in source order."""
    if isinstance(tree, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in tree.values)]
    if isinstance(tree, ast.Constant):
        return [tree.value] if isinstance(tree.value, str) else []
    return [text for child in ast.iter_child_nodes(tree) for text in _strings(child)]


def _sql_statements() -> list[tuple[str, str]]:
    statements = []
    for path in sorted(STORE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # a statement is often split over several string pieces of one call: join the
        # pieces of each expression statement / call argument before looking at it
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for arg in node.args[:1]:
                    text = " ".join(_strings(arg))
                    if _SQL_START.search(text):
                        statements.append((path.name, text))
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                text = " ".join(_strings(node.value))
                if re.search(r"\b(CREATE|SELECT|INSERT)\b", text):
                    statements.append((path.name, text))
    return statements


def test_store_sql_is_found() -> None:
    statements = _sql_statements()
    assert len(statements) > 40
    assert any("session_guard_snapshots" in sql for _, sql in statements)


def test_store_sql_names_only_guard_tables() -> None:
    wrong = []
    for name, sql in _sql_statements():
        for table in (next(g for g in m if g) for m in _TABLE_REF.findall(_QUOTED.sub("''", sql))):
            if table.upper() in {"CONFLICT", "SET"} or table.startswith("session_guard_"):
                continue
            if table not in ALLOWED:
                wrong.append((name, table, sql[:120]))
    assert not wrong


def test_store_never_names_a_hermes_table() -> None:
    hits = []
    for path in sorted(STORE_DIR.glob("*.py")):
        for text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            unquoted = _QUOTED.sub("''", text)
            if not _SQL_START.search(unquoted) and not re.search(r"\b(FROM|JOIN|INTO|TABLE)\b", unquoted):
                continue
            hits += [(path.name, word) for word in re.findall(r"[A-Za-z_]\w*", unquoted) if word in HERMES_TABLES]
    assert not hits


def test_lock_clearing_refuses_hermes_tables(tmp_path: Path) -> None:
    store = GuardStore(tmp_path / "state.db")
    try:
        for table in ("compression_locks", "sessions"):
            with pytest.raises(ValueError):
                store.clear_expired_lock(table=table, session_column="session_id", expires_column="expires_at",
                                         session_id="s", now=0.0)
            with pytest.raises(ValueError):
                store.clear_lock_of(table=table, session_column="session_id", holder_column="holder",
                                    session_id="s", holder="h")
    finally:
        store.close()


def test_the_check_sees_a_hermes_table() -> None:
    sql = "SELECT id FROM messages WHERE session_id = ?"
    assert [next(g for g in m if g) for m in _TABLE_REF.findall(sql)] == ["messages"]
    assert [w for w in re.findall(r"[A-Za-z_]\w*", sql) if w in HERMES_TABLES] == ["messages"]


@pytest.mark.parametrize("mode", ["delete", "wal"])
def test_the_store_keeps_the_journal_mode_hermes_chose(tmp_path: Path, mode: str) -> None:
    """Hermes 0.20+ keeps state.db in rollback mode where WAL is unsafe (an SQLite with the
    WAL-reset bug, a network filesystem, ``database.journal_mode: delete``): the guard's
    writes and reads leave the file in whatever mode Hermes gave it."""
    import sqlite3

    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    assert conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0] == mode
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")
    conn.commit()
    conn.close()
    store = GuardStore(db)
    try:
        store.record_generation("s1", block_len=3, block_digest="d", op_id="op", snapshot_id=None)
        assert store.generation("s1") is not None
    finally:
        store.close()
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == mode
    finally:
        check.close()


def test_writes_nested_in_one_transaction_commit_together_or_not_at_all(tmp_path: Path) -> None:
    """A compaction's summary tags and generation go in one commit (store.transaction()
    nested): both are stored, or, when the second fails, neither."""
    store = GuardStore(tmp_path / "state.db")
    try:
        with store.transaction():
            store.record_summaries("s1", "snap", [(0, "h1", 1, 4)], 1.0)
            record = store.record_generation("s1", block_len=2, block_digest="d", op_id="op1", snapshot_id="snap")
        assert record.generation == 1 and store.compacted_ranges(["s1"]) == {"snap": (1, 4)}
        with pytest.raises(RuntimeError, match="second write"), store.transaction():
            store.record_summaries("s1", "snap2", [(0, "h2", 5, 9)], 2.0)
            raise RuntimeError("second write failed")
        assert store.compacted_ranges(["s1"]) == {"snap": (1, 4)}
        assert store.generation("s1").generation == 1  # type: ignore[union-attr]
        store.record_generation("s1", block_len=3, block_digest="e", op_id="op2", snapshot_id=None)  # on its own
        assert store.generation("s1").generation == 2  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_database_is_known_by_its_resolved_path_and_a_relative_name_follows_the_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert store_pkg.database_key(tmp_path / "link" / "state.db") == real.resolve() / "state.db"
    monkeypatch.chdir(real)
    assert store_pkg.database_key("state.db") == real.resolve() / "state.db"
    monkeypatch.chdir(tmp_path)
    assert store_pkg.database_key("state.db") == tmp_path.resolve() / "state.db"
