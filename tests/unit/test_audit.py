from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from hermes_session_guard.audit import AuditLog, read_events


def test_events_are_json_lines_with_the_bound_ids(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "logs" / "audit.jsonl")
    op = log.operation("S1", "op1")
    op.info("compression.started", messages=3)
    op.info("compression.done", session_id_after="S1")
    events = read_events(tmp_path / "logs" / "audit.jsonl")
    assert [e["event"] for e in events] == ["compression.started", "compression.done"]
    assert all(e["session_id"] == "S1" and e["op_id"] == "op1" and e["ts"] for e in events)


def test_binding_survives_a_thread_hop(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.jsonl")
    op = log.operation("S1")
    other = log.operation("S2")
    t = threading.Thread(target=lambda: (other.info("x"), op.info("compression.done")))
    t.start()
    t.join()
    by_event = {e["event"]: e["session_id"] for e in read_events(tmp_path / "a.jsonl")}
    assert by_event == {"x": "S2", "compression.done": "S1"}


def test_events_reach_stdlib_logging(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hermes_session_guard"):
        AuditLog(tmp_path / "a.jsonl").operation("S1", "op9").warning("compression.failed", reason="HTTP 500")
    (rec,) = [r for r in caplog.records if r.name == "hermes_session_guard"]
    assert rec.levelno == logging.WARNING
    assert "compression.failed" in rec.getMessage() and "S1" in rec.getMessage() and "HTTP 500" in rec.getMessage()


def test_unwritable_log_does_not_raise(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    AuditLog(blocker / "sub" / "a.jsonl").operation("S1").info("compression.started")  # must not raise


def test_the_audit_log_does_not_load_rich_and_rich_still_imports_afterwards(tmp_path: Path) -> None:
    """structlog would import rich (and pygments) for console output the guard never uses."""
    import os
    import subprocess
    import sys

    pytest.importorskip("rich")
    code = (
        "import sys, pathlib\n"
        "from hermes_session_guard.audit import AuditLog, read_events\n"
        "loaded = 'rich' in sys.modules\n"
        f"path = pathlib.Path({str(tmp_path / 'a.jsonl')!r})\n"
        "AuditLog(path).operation('S1').info('compression.done')\n"
        "import rich.console\n"
        "print(loaded, [e['event'] for e in read_events(path)], rich.console.Console.__name__)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.split("\n")[0] == "False ['compression.done'] Console"


def test_ids_are_written_unscanned_and_other_strings_go_through_the_secret_rules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_session_guard import audit

    scanned: list[str] = []
    monkeypatch.setattr(audit, "mask_secrets", lambda value: scanned.append(value) or "[masked]")
    monkeypatch.setattr(audit, "_clean_values", set())
    out = audit.scrubbed({"event": "compression.done", "session_id": "S-1", "session_id_after": "S-2",
                          "snapshot_id": "S-1.snapshot.1", "lock_holder": "pid:1:op", "reason": "why"})
    assert scanned == ["why"]
    assert out["session_id_after"] == "S-2" and out["reason"] == "[masked]"
