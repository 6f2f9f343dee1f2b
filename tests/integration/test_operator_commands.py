"""doctor, repair, status and selftest against real Hermes homes.

The corrupted homes under ``tests/fixtures/corrupt`` were made by the real host
without the guard (``scripts/make_corrupt_fixtures.py``); each test works on a
copy. Fixtures run on the Hermes release that made them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance.corruption import diagnose
from hermes_session_guard.maintenance.state_inspection import MERGED_END_REASON, load_home_state
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.selftest.gateway import start_gateway
from hermes_session_guard.store import GuardStore

from .conftest import HERMES_VERSION, HOST_HAS_IN_PLACE, MODES, new_agent

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "corrupt"


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text(encoding="utf-8"))


ALL_FIXTURES = sorted(p for p in FIXTURES.iterdir() if (p / "manifest.json").exists())
HOST_FIXTURES = [p for p in ALL_FIXTURES if _manifest(p)["hermes_version"] == HERMES_VERSION]
OTHER_FIXTURES = [p for p in ALL_FIXTURES if _manifest(p)["hermes_version"] != HERMES_VERSION]


def materialize(fixture: Path, dest: Path) -> Path:
    """A writable copy of a fixture home with ``state.db`` unpacked."""
    import gzip
    import shutil

    shutil.copytree(fixture, dest)
    with gzip.open(dest / "state.db.gz", "rb") as packed, open(dest / "state.db", "wb") as raw:
        shutil.copyfileobj(packed, raw)
    (dest / "state.db.gz").unlink()
    return dest


# Hermes 0.20+ seeds SOUL.md into a HERMES_HOME that lacks one when its config module is first
# imported in a process (every home has one after Hermes's first run; the fixtures keep only
# state.db, config and sessions). Hermes's file, never written by the guard.
HERMES_SEEDED = {"SOUL.md"}


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(("-wal", "-shm"))
            and str(p.relative_to(root)) not in HERMES_SEEDED}


def _rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _live(db: Path, sid: str) -> list[tuple[str, str]]:
    cols = {r[1] for r in _rows(db, "PRAGMA table_info(messages)")}
    live = " AND active = 1" if "active" in cols else ""
    return [(r, c) for r, c in _rows(db, f"SELECT role, content FROM messages WHERE session_id = ?{live} ORDER BY id",
                                     sid)]


def _routing(home: Path) -> dict[tuple[str, str], str]:
    """(where, key) -> session id, from sessions.json and the gateway_routing table."""
    out: dict[tuple[str, str], str] = {}
    path = home / "sessions" / "sessions.json"
    for key, entry in json.loads(path.read_text(encoding="utf-8")).items():
        if isinstance(entry, dict):
            out[("file", key)] = entry["session_id"]
    if _rows(home / "state.db", "SELECT name FROM sqlite_master WHERE name = 'gateway_routing'"):
        for key, sid in _rows(home / "state.db",
                              "SELECT session_key, json_extract(entry_json, '$.session_id') FROM gateway_routing"):
            out[("table", key)] = sid
    return out


def _run(argv: list[str], home: Path, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setenv("HERMES_HOME", str(home))
    capsys.readouterr()  # drop what the host printed before
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _later_than_generation(fixture_home: Path) -> float:
    """A clock past every lease the fixture's killed gateways left behind."""
    generated = datetime.fromisoformat(_manifest(fixture_home)["generated_at"]).timestamp()
    return max(time.time(), generated + 3600)


requires_fixture = pytest.mark.skipif(not HOST_FIXTURES, reason=f"no corrupted fixture made by Hermes {HERMES_VERSION}")


@requires_fixture
@pytest.mark.parametrize("fixture", HOST_FIXTURES, ids=lambda p: p.name)
def test_doctor_finds_every_planted_corruption(fixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    home = materialize(fixture, tmp_path / "home")
    before = _files(home)
    code, out, _ = _run(["doctor", "--json"], home, monkeypatch, capsys)
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    _, findings = diagnose(load_home_state(home, now=_later_than_generation(fixture)))
    for planted in _manifest(fixture)["planted"]:
        match = [f for f in findings if f.signature == planted["signature"] and f.session_id == planted["session_id"]
                 and set(planted["sessions"]) <= set(f.sessions)
                 and (("routing_key" not in planted) or f.extra.get("routing_key") == planted["routing_key"])]
        assert match, f"doctor missed {planted}: {[f.as_dict() for f in findings]}"
        if "count" in planted:
            assert match[0].count == planted["count"]
    text_code, text, _ = _run(["doctor"], home, monkeypatch, capsys)
    assert text_code == 1
    for planted in _manifest(fixture)["planted"]:
        if planted["signature"] != "expired_compression_lock":
            assert f"[{planted['signature']}] {planted['session_id']}" in text
    assert _files(home) == before  # read-only


def _original_rows(db: Path, members: list[str]) -> dict[str, list[tuple[str, str]]]:
    return {sid: [(r, c) for r, c in _rows(db, "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id",
                                          sid)] for sid in members}


def _deepest_with_rows(lineage: list[str], db: Path) -> str:
    parents = dict(_rows(db, "SELECT id, parent_session_id FROM sessions"))

    def depth(sid: str) -> int:
        d = 0
        while parents.get(sid) in lineage:
            sid, d = parents[sid], d + 1
        return d

    started = dict(_rows(db, "SELECT id, started_at FROM sessions"))
    holding = [sid for sid in lineage if _live(db, sid)]
    return min(holding, key=lambda sid: (-depth(sid), started[sid], sid))


@requires_fixture
@pytest.mark.parametrize("fixture", HOST_FIXTURES, ids=lambda p: p.name)
def test_repair_brings_each_lineage_back_under_its_original_id(
    fixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = materialize(fixture, tmp_path / "home")
    db = home / "state.db"
    manifest = _manifest(fixture)
    lineages: dict[str, list[str]] = manifest["lineages"]
    members = [sid for lin in lineages.values() for sid in lin]
    originals = _original_rows(db, members)
    bases = {root: _deepest_with_rows(lin, db) for root, lin in lineages.items()}
    base_rows = {root: _live(db, base) for root, base in bases.items()}
    routing_before = _routing(home)
    total_rows = _rows(db, "SELECT COUNT(*) FROM messages")[0][0]

    # dry run: prints the plan, writes nothing
    before = _files(home)
    code, out, _ = _run(["repair"], home, monkeypatch, capsys)
    assert code == 0 and "dry run" in out
    for root in lineages:
        assert f"lineage {root}" in out
    assert _files(home) == before

    code, out, _ = _run(["repair", "--apply", "--json"], home, monkeypatch, capsys)
    result = json.loads(out)
    assert code == 0, result
    assert result["applied"] is True and not [f for f in result["remaining"] if f["repaired_by"]]

    # a consistent backup next to the database, with the original rows
    backup = Path(result["backup"])
    assert backup.parent == home and backup.name.startswith("state.db.session-guard-backup-")
    assert _rows(backup, "SELECT COUNT(*) FROM messages")[0][0] == total_rows
    assert _rows(backup, "PRAGMA integrity_check") == [("ok",)]

    store = GuardStore(db)
    try:
        for root, lineage in lineages.items():
            sessions = {sid: (ended, reason) for sid, ended, reason in _rows(
                db, "SELECT id, ended_at, end_reason FROM sessions")}
            # the conversation lives under its original id again
            assert sessions[root] == (None, None)
            assert all(sessions[m][1] == MERGED_END_REASON for m in lineage[1:])
            live = _live(db, root)
            assert live[: len(base_rows[root])] == base_rows[root]
            # nothing lost: every row the lineage had is live in the root or in one of its snapshots
            kept = set(live)
            snaps = store.list_snapshots(root)
            for snap in snaps:
                assert snap.snapshot_id.startswith(f"{root}.snapshot.") and snap.host_mode == "repair"
                kept |= {(m["role"], m["content"]) for m in store.snapshot_messages(snap.snapshot_id)}
            for sid in lineage:
                missing = [row for row in originals[sid] if row not in kept]
                assert not missing, f"{sid}: {len(missing)} row(s) neither live nor in a snapshot"
            # the other sessions' rows were not touched (never deleted)
            for sid in lineage[1:]:
                assert _rows(db, "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id",
                             sid) == originals[sid]
        # routing that named any member of a lineage names its root now; other routing is unchanged
        index = {sid: root for root, lin in lineages.items() for sid in lin}
        routing_after = _routing(home)
        assert routing_after.keys() == routing_before.keys()
        for where_key, sid in routing_before.items():
            assert routing_after[where_key] == index.get(sid, sid)
    finally:
        store.close()

    # idempotent: a second doctor finds nothing, a second repair does nothing
    code, out, _ = _run(["doctor"], home, monkeypatch, capsys)
    assert code == 0 and "no corruption found" in out
    backups = sorted(home.glob("state.db.session-guard-backup-*"))
    state_before = _files(home)
    code, out, _ = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 0 and "nothing to repair" in out
    assert sorted(home.glob("state.db.session-guard-backup-*")) == backups
    assert _files(home) == state_before
    code, out, _ = _run(["status", "--json"], home, monkeypatch, capsys)
    status = {s["session_id"]: s for s in json.loads(out)["sessions"]}
    for root in lineages:
        expected = sum(1 for sid in lineages[root] if sid != bases[root] and _live_in_backup(backup, sid))
        assert status.get(root, {}).get("snapshots", 0) == expected


def _live_in_backup(backup: Path, sid: str) -> bool:
    return bool(_live(backup, sid))


ANOMALY_B_FIXTURES = [p for p in HOST_FIXTURES if _manifest(p)["scenario"] == "anomaly-b"]


@pytest.mark.skipif(not ANOMALY_B_FIXTURES, reason=f"no anomaly B fixture made by Hermes {HERMES_VERSION} "
                    "(from 0.16 the host's own compression lock prevents the fork)")
def test_anomaly_b_repair_keeps_both_agents_turns_and_the_late_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture = ANOMALY_B_FIXTURES[0]
    home = materialize(fixture, tmp_path / "home")
    (root,) = _manifest(fixture)["lineages"]
    code, _, _ = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 0
    contents = [c for _, c in _live(home / "state.db", root)]
    summaries = [c for c in contents if "[CONTEXT COMPACTION" in c]
    assert len(summaries) == 1  # one summary generation, not one per fork
    for turn in ("terminal: recap the plan", "gateway: question one", "terminal: add a rollback step"):
        assert contents.count(turn) == 1, turn
    assert contents.index("gateway: question one") < contents.index("terminal: add a rollback step")
    assert [r for r, _ in _live(home / "state.db", root)][-2:] == ["user", "assistant"]


def _gateway_follow_up(home: Path, chat: str, text: str) -> str:
    async def go() -> str:
        # The fixture's chats were last active when it was made: past Hermes's daily (04:00)
        # and idle (24 h) session resets, which would open a new session whatever the routing says;
        # the harness's gateway never resets.
        gw = await start_gateway(resume_interrupted=False)
        await gw.say(text, gw.chat(chat), timeout=180.0)
        return str(gw.bound_session_id(gw.chat(chat)))

    return asyncio.run(go())


@requires_fixture
def test_after_repair_the_gateway_delivers_to_the_original_id(
    discovered: Any, llm: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    import hermes_session_guard

    fixture = next(p for p in HOST_FIXTURES if any(x["signature"] == "routing_not_at_tip"
                                                   for x in _manifest(p)["planted"]))
    home = materialize(fixture, tmp_path / "home")
    stale = next(x for x in _manifest(fixture)["planted"] if x["signature"] == "routing_not_at_tip")
    root, chat = stale["sessions"][0], stale["routing_key"].rsplit(":", 1)[1]
    code, _, _ = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 0
    probe.write_config(home, llm.base_url, in_place=False if HOST_HAS_IN_PLACE else None)
    llm.reset()
    llm.configure(reply_text="answered on the original id")
    hermes_session_guard.current_runtime() or hermes_session_guard.install()
    import hermes_state

    # SessionDB() without a path uses a module constant computed when Hermes was first imported
    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", home / "state.db")
    sessions_before = {r[0] for r in _rows(home / "state.db", "SELECT id FROM sessions")}

    routed = _gateway_follow_up(home, chat, "follow-up after the repair")

    assert routed == root
    live = _live(home / "state.db", root)
    assert live[-2:] == [("user", "follow-up after the repair"), ("assistant", "answered on the original id")]
    assert {r[0] for r in _rows(home / "state.db", "SELECT id FROM sessions")} == sessions_before
    assert _rows(home / "state.db", "SELECT ended_at FROM sessions WHERE id = ?", root) == [(None,)]


@pytest.mark.parametrize("mode", MODES)
def test_a_home_the_guard_compressed_is_clean(guard: Any, db: Any, llm: FakeLLMServer, home: Path, mode: str,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    sid = "20260528_155201_68dc5996"
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, mode)
    probe.mark_flushed(agent, messages)
    compressed, _ = agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    assert len(compressed) < len(messages)
    agent.run_conversation("next question", conversation_history=compressed)

    code, out, _ = _run(["doctor"], home, monkeypatch, capsys)
    assert code == 0 and "no corruption found" in out
    code, out, _ = _run(["repair"], home, monkeypatch, capsys)
    assert code == 0 and "nothing to repair" in out
    code, out, _ = _run(["status", "--json"], home, monkeypatch, capsys)
    (session,) = [s for s in json.loads(out)["sessions"] if s["session_id"] == sid]
    assert session["compressions"]["done"] == 1 and session["snapshots"] == 1 and not session["ended"]


def test_a_guard_lease_left_by_a_dead_process_is_reported_and_cleared(
    guard: Any, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """The guard's own lease table is registered with the operator commands: status
    lists its rows, doctor reports an expired one; repair refuses while a live one is
    held, and clears the expired one once nothing runs."""
    sid, other = "20260528_155201_68dc5996", "20260528_155202_0a1b2c3d"
    live = f"pid={os.getppid()}:tid=1:guard-op=live"  # a running pid: nothing proves it dead
    probe.seed_session(db, sid, probe.seed_messages())
    probe.seed_session(db, other, probe.seed_messages())
    store = GuardStore(home / "state.db")
    try:
        assert store.try_acquire_lease(sid, "pid=999999:tid=1:guard-op=dead", 60.0, now=time.time() - 3600)
        assert store.try_acquire_lease(other, live, 300.0)
    finally:
        store.close()

    code, out, _ = _run(["status", "--json"], home, monkeypatch, capsys)
    locks = {(lk["session_id"], lk["kind"], lk["expired"]) for lk in json.loads(out)["locks"]}
    assert {(sid, "guard", True), (other, "guard", False)} <= locks
    code, out, _ = _run(["doctor", "--json"], home, monkeypatch, capsys)
    found = [f for f in json.loads(out)["findings"] if f["signature"] == "expired_compression_lock"]
    assert code == 1 and [(f["session_id"], f["extra"]["table"]) for f in found] == [(sid, "session_guard_locks")]

    # a live lock means a compression is running: repair refuses, naming it, and changes nothing
    code, out, _ = _run(["repair", "--apply", "--json"], home, monkeypatch, capsys)
    assert code == 2 and f"holds the guard lock on {other}" in json.loads(out)["error"], out
    assert len(_rows(home / "state.db", "SELECT session_id FROM session_guard_locks")) == 2
    store = GuardStore(home / "state.db")
    try:
        assert store.release_lease(other, live)
    finally:
        store.close()
    code, out, _ = _run(["repair", "--apply", "--json"], home, monkeypatch, capsys)
    assert code == 0, out
    assert _rows(home / "state.db", "SELECT session_id FROM session_guard_locks") == []
    code, out, _ = _run(["doctor"], home, monkeypatch, capsys)
    assert code == 0 and "no corruption found" in out


@pytest.mark.skipif(not HOST_HAS_IN_PLACE, reason="this host always rotates without the guard")
def test_a_home_compressed_in_place_by_the_host_alone_is_clean(
    no_guard: None, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    sid = "20260528_155201_68dc5996"
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    code, out, _ = _run(["doctor"], home, monkeypatch, capsys)
    assert code == 0 and "no corruption found" in out


@pytest.mark.skipif(HOST_HAS_IN_PLACE and "rotate" not in MODES, reason="host never rotates")
def test_doctor_sees_a_rotation_the_host_made_just_now(
    no_guard: None, db: Any, llm: FakeLLMServer, home: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    sid = "20260528_093510_66bfaec7"
    messages = probe.seed_messages()
    probe.seed_session(db, sid, messages)
    agent = new_agent(db, llm, sid, "rotate")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    code, out, _ = _run(["doctor", "--json"], home, monkeypatch, capsys)
    found = {(f["signature"], f["session_id"]) for f in json.loads(out)["findings"]}
    assert code == 1 and ("rotated_lineage", sid) in found
    code, out, _ = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 0
    assert [r["id"] for r in probe.sessions_table(home / "state.db") if r["ended_at"] is None] == [sid]
    assert _run(["doctor"], home, monkeypatch, capsys)[0] == 0


@requires_fixture
def test_repair_refuses_while_another_process_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    home = materialize(HOST_FIXTURES[0], tmp_path / "home")
    before = _files(home)
    writer = sqlite3.connect(str(home / "state.db"), isolation_level=None, timeout=0.1)
    writer.execute("BEGIN IMMEDIATE")
    try:
        code, out, err = _run(["repair", "--apply"], home, monkeypatch, capsys)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert code == 2 and out == ""
    assert err.startswith("error: repair refused: state.db is busy") and len(err.strip().splitlines()) == 1
    assert _files(home) == before and not list(home.glob("state.db.session-guard-backup-*"))


@requires_fixture
def test_repair_refuses_while_a_gateway_runs_on_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    home = materialize(HOST_FIXTURES[0], tmp_path / "home")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom gateway import status\n"
         "assert status.acquire_gateway_runtime_lock()\nprint('held', flush=True)\nsys.stdin.read()"],
        env={**dict(__import__("os").environ), "HERMES_HOME": str(home)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = _files(home)
        code, _, err = _run(["repair", "--apply"], home, monkeypatch, capsys)
        assert code == 2 and "a Hermes gateway is running" in err
        assert _files(home) == before
    finally:
        holder.communicate("", timeout=30)
    code, _, _ = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 0


def _schema_version(fixture: Path) -> int | None:
    import gzip
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, gzip.open(fixture / "state.db.gz", "rb") as packed:
        raw = Path(tmp) / "state.db"
        raw.write_bytes(packed.read())
        conn = sqlite3.connect(str(raw))
        try:
            return host.read_schema_version(conn)
        finally:
            conn.close()


# Fixtures whose schema the installed Hermes does not write (0.13 and 0.14 share one).
OTHER_SCHEMA_FIXTURES = [p for p in OTHER_FIXTURES if _schema_version(p) != host.host_schema_version()]


@pytest.mark.skipif(not OTHER_SCHEMA_FIXTURES, reason="no fixture with another state.db schema")
def test_repair_refuses_a_database_of_another_hermes_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    home = materialize(OTHER_SCHEMA_FIXTURES[0], tmp_path / "home")
    assert _run(["doctor"], home, monkeypatch, capsys)[0] == 1  # reading works across releases
    before = _files(home)
    code, _, err = _run(["repair", "--apply"], home, monkeypatch, capsys)
    assert code == 2 and "schema version" in err
    assert _files(home) == before


def test_selftest_passes_and_reports_each_check(home: Path, discovered: Any, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["selftest", "--json"], home, monkeypatch, capsys)
    report = json.loads(out)
    assert code == 0, report
    assert report["ok"] and report["hermes_version"] == HERMES_VERSION and report["home"]["guard_enabled"]
    states = {c["name"]: c["state"] for c in report["checks"]}
    assert states["agent.session_id unchanged"] == "pass"
    assert states["doctor finds no corruption afterwards"] == "pass"
    # a lease on every release: the guard's own on 0.13-0.15, Hermes's compression_locks from 0.16
    assert states["compression lock taken and released"] == "pass"
    seams = {s["name"]: s["state"] for s in report["seams"]}
    assert seams["compression"] == "patched"
    # A lazy row whose module Hermes itself cannot import on this Python stays pending (0.22's
    # tui_gateway.server needs Python 3.14 annotations: NameError on 3.11).
    unimportable = {name for name, state in seams.items() if state == "pending" and _hermes_cannot_import(name)}
    assert all(state in ("patched", "not-needed") for name, state in seams.items() if name not in unimportable), seams


def _hermes_cannot_import(seam: str) -> bool:
    from .conftest import host_row

    row = host_row(seam)
    if row is None or not row.lazy:
        return False
    done = subprocess.run([sys.executable, "-c", f"import {row.module}"], capture_output=True, text=True, timeout=300)
    return done.returncode != 0


@pytest.mark.slow
@pytest.mark.skipif(not HOST_FIXTURES, reason=f"no corrupted fixture made by Hermes {HERMES_VERSION}")
def test_the_fixture_script_still_reproduces_the_corruption(tmp_path: Path) -> None:
    """The committed fixtures are reproducible with the installed host."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_corrupt_fixtures.py"), "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900,
                          env={**dict(__import__("os").environ), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    made = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in made] == [p.name for p in HOST_FIXTURES]
    for fixture in made:
        home = materialize(fixture, tmp_path / f"{fixture.name}-home")
        _, findings = diagnose(load_home_state(home, now=time.time() + 3600))
        for planted in _manifest(fixture)["planted"]:
            assert any(f.signature == planted["signature"] and f.session_id == planted["session_id"]
                       for f in findings), planted
