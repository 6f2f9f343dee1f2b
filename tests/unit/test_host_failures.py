"""Host look-ups that fail say why in the log, with the same outcome as before."""

from __future__ import annotations

import logging
import sqlite3
import sys
import types
from dataclasses import replace

import pytest

from hermes_session_guard import host
from hermes_session_guard.host import gateway as host_gateway
from hermes_session_guard.seams import table as seams
from hermes_session_guard.seams.apply import verify_row

APPROVAL = "tools.approval:has_blocking_approval"


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_gateway, "_warned", set())


def _approval_module(monkeypatch: pytest.MonkeyPatch, fn: object) -> None:
    module = types.ModuleType("tools.approval")
    module.has_blocking_approval = fn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tools.approval", module)


def test_missing_approval_module_is_logged_not_silent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_warnings: None
) -> None:
    monkeypatch.setitem(sys.modules, "tools.approval", None)  # import fails as on a release that renamed it
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"):
        assert host.approval_pending("agent:main:telegram:dm:1") is False
        assert host.approval_pending("agent:main:telegram:dm:1") is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "warned once per process, then debug"
    assert "tools.approval.has_blocking_approval is not importable" in warnings[0].getMessage()
    assert "telegram" not in caplog.text  # the session key is not logged


def test_renamed_approval_function_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_warnings: None
) -> None:
    monkeypatch.setitem(sys.modules, "tools.approval", types.ModuleType("tools.approval"))
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        assert host.approval_pending("k") is False
    assert "not importable" in caplog.text


def test_failing_approval_check_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_warnings: None
) -> None:
    def boom(_key: str) -> bool:
        raise RuntimeError("approval state unavailable")

    _approval_module(monkeypatch, boom)
    with caplog.at_level(logging.WARNING, logger="hermes_session_guard"):
        assert host.approval_pending("k") is False
    assert "has_blocking_approval failed (RuntimeError" in caplog.text


def test_pending_approval_is_seen(monkeypatch: pytest.MonkeyPatch, fresh_warnings: None) -> None:
    _approval_module(monkeypatch, lambda key: key == "k")
    assert host.approval_pending("k") is True
    assert host.approval_pending("other") is False


def test_busy_message_rows_require_the_approval_check() -> None:
    rows = seams.rows_for("busy_message")
    assert rows
    assert all(APPROVAL in row.requires for row in rows)


def test_verify_row_reports_a_missing_approval_check(monkeypatch: pytest.MonkeyPatch) -> None:
    row = replace(seams.rows_for("busy_message")[-1], wrapper=None)  # only its requires are checked
    _approval_module(monkeypatch, lambda key: False)
    assert verify_row(row) is None
    monkeypatch.setitem(sys.modules, "tools.approval", None)
    assert verify_row(row) == f"required host name {APPROVAL} not found"
    monkeypatch.setitem(sys.modules, "tools.approval", types.ModuleType("tools.approval"))
    assert verify_row(row) == f"required host name {APPROVAL} not found"


def test_schema_version_without_its_table_is_unknown(caplog: pytest.LogCaptureFixture) -> None:
    conn = sqlite3.connect(":memory:")
    with caplog.at_level(logging.DEBUG, logger="hermes_session_guard"):
        assert host.read_schema_version(conn) is None
    assert "reading schema_version failed (OperationalError" in caplog.text
