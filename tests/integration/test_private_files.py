"""What the guard writes to disk, on the real host, under a 022 umask: the audit log and
a ``logs/`` it creates, hand-off packets and their directory, repair backups (which keep
state.db's mode); recall queries reach the audit log only as a length and a hash; and
hand-off packets written at the same instant (six concurrent ``handoff`` runs) or next to
a dangling symlink all land under names of their own."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.audit import read_events
from hermes_session_guard.files import backup_path_for
from hermes_session_guard.handoff import packet as handoff_packet
from hermes_session_guard.maintenance.lineage_repair import backup_state_db
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.store import text_hash

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")

SID = "20260602_120000_abcdef"
FROZEN = 1_780_000_000.123456  # every run in this file writes its packets at this instant


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hand-off packet of this test is stamped with the same instant."""
    from hermes_session_guard.handoff import writer as handoff

    class _Time:
        def __getattr__(self, name: str) -> Any:
            import time

            return getattr(time, name)

        @staticmethod
        def time() -> float:
            return FROZEN

    monkeypatch.setattr(handoff, "time", _Time())


def _packets(home: Path) -> list[Path]:
    d = home / "handoffs"
    return sorted(p for p in d.iterdir() if p.suffix == ".md" and not p.is_symlink()) if d.exists() else []


def test_audit_log_and_the_logs_dir_it_creates_are_private(umask_022: None, guard: Any, db: Any,
                                                          home: Path) -> None:
    from hermes_session_guard.commands.cli import main

    logs = home / "logs"
    if logs.exists():  # Hermes made it at import for its own logs (0.20+: with subdirectories): not the guard's
        shutil.rmtree(logs)
    probe.seed_session(db, SID, probe.seed_messages(4))
    assert main(["handoff", SID]) == 0
    audit_log = home / "logs" / "session_guard.jsonl"
    assert [e["event"] for e in read_events(audit_log)] == ["handoff.packet_written"]
    assert _mode(audit_log) == 0o600
    assert _mode(audit_log.parent) == 0o700


def test_an_audit_log_left_world_readable_is_tightened(umask_022: None, guard: Any, db: Any, home: Path) -> None:
    from hermes_session_guard.commands.cli import main

    audit_log = home / "logs" / "session_guard.jsonl"
    audit_log.parent.mkdir(parents=True, exist_ok=True)
    audit_log.write_text("", encoding="utf-8")
    os.chmod(audit_log, 0o644)
    probe.seed_session(db, SID, probe.seed_messages(4))
    assert main(["handoff", SID]) == 0
    assert _mode(audit_log) == 0o600


def test_packets_and_their_directory_are_private(umask_022: None, guard: Any, db: Any, home: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    assert main(["handoff", SID]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize("db_mode", [0o600, 0o644])
def test_a_repair_backup_is_private_whatever_state_dbs_mode(umask_022: None, guard: Any, db: Any, home: Path,
                                                             db_mode: int) -> None:
    probe.seed_session(db, SID, probe.seed_messages(4))
    state_db = home / "state.db"
    os.chmod(state_db, db_mode)
    backup = backup_state_db(state_db, backup_path_for(state_db))
    assert backup.name.startswith("state.db.session-guard-backup-")
    assert _mode(backup) == 0o600  # a copy of every session: never readable by others, whatever state.db is
    assert probe.open_db(backup).get_messages(SID)  # a usable copy


def test_a_repair_backup_refuses_to_follow_a_symlink(umask_022: None, guard: Any, db: Any, home: Path,
                                                      tmp_path: Path) -> None:
    probe.seed_session(db, SID, probe.seed_messages(4))
    state_db = home / "state.db"
    target = backup_path_for(state_db)
    elsewhere = tmp_path / "elsewhere.db"
    target.symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        backup_state_db(state_db, target)
    assert not elsewhere.exists()


def test_recall_queries_reach_the_audit_log_as_length_and_hash(guard: Any, db: Any, llm: FakeLLMServer,
                                                               home: Path) -> None:
    from hermes_session_guard.summaries import recall_tool

    from .conftest import new_agent

    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    query = "what was the MYSQL_ROOT_PASS=Hunter2Hunter2 we used for staging"
    recall_tool.recall({"query": query}, SID)
    text = (home / "logs" / "session_guard.jsonl").read_text(encoding="utf-8")
    assert "Hunter2Hunter2" not in text and "staging" not in text
    (event,) = [e for e in read_events(home / "logs" / "session_guard.jsonl") if e["event"] == "recall.answered"]
    assert event["query_chars"] == len(query) and event["query_hash"] == text_hash(query)
    assert "query" not in event


# -- unique packet names ------------------------------------------------------------------


def test_six_concurrent_handoffs_in_one_instant_write_six_packets(guard: Any, db: Any, home: Path,
                                                                  frozen_clock: None) -> None:
    from hermes_session_guard.handoff.writer import write_requested_packet

    probe.seed_session(db, SID, probe.seed_messages(4))
    barrier = threading.Barrier(6)
    written: list[Path] = []
    errors: list[BaseException] = []

    def one(n: int) -> None:
        barrier.wait()
        try:
            written.append(write_requested_packet(None, SID, f"run {n}", via="cli", home=home))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(written)) == 6 and sorted(written) == _packets(home)
    notes = sorted(p.read_text(encoding="utf-8").split("## Note\n\n", 1)[1].split("\n", 1)[0] for p in written)
    assert notes == [f"run {n}" for n in range(6)]  # each run's own packet, none overwritten
    first = handoff_packet.packet_filename(SID, FROZEN)
    assert {p.name for p in written} == {first} | {first[: -len(".md")] + f"-{n}.md" for n in range(2, 7)}


def test_a_dangling_symlink_at_the_name_is_skipped_not_followed(guard: Any, db: Any, home: Path, tmp_path: Path,
                                                                frozen_clock: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    (home / "handoffs").mkdir(mode=0o700)
    nowhere = tmp_path / "not-there.md"
    link = home / "handoffs" / handoff_packet.packet_filename(SID, FROZEN)
    link.symlink_to(nowhere)
    assert main(["handoff", SID]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path != link and path.name == handoff_packet.packet_filename(SID, FROZEN, 2)
    assert link.is_symlink() and not nowhere.exists()
    assert path.read_text(encoding="utf-8").startswith(handoff_packet.PACKET_HEADING)


def test_audit_events_of_concurrent_handoffs_name_every_packet(guard: Any, db: Any, home: Path,
                                                               frozen_clock: None) -> None:
    from hermes_session_guard.handoff.writer import write_requested_packet

    probe.seed_session(db, SID, probe.seed_messages(4))
    paths = {str(write_requested_packet(None, SID, None, via="cli", home=home)) for _ in range(3)}
    events = [e for e in read_events(home / "logs" / "session_guard.jsonl") if e["event"] == "handoff.packet_written"]
    assert {e["path"] for e in events} == paths and len(paths) == 3
    json.dumps(events)  # plain JSON values only
