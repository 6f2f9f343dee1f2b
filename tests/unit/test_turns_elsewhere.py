"""Turns the guard cannot see (maintenance.turns_elsewhere): config.yaml's turn isolation
settings, and Hermes's own compactions in state.db with no guard record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_session_guard.maintenance.config_findings import SEED_LINES, isolation_findings, isolation_settings
from hermes_session_guard.maintenance.turns_elsewhere import turns_elsewhere, unguarded_compactions
from hermes_session_guard.store import GuardStore

from .hermes_like_db import SUMMARY, HermesLikeHome

ENABLED_AT = 1000.0  # config.yaml's mtime: the latest time the guard can have been enabled


@pytest.fixture
def hermes(tmp_path: Path) -> HermesLikeHome:
    h = HermesLikeHome(tmp_path / "home")
    os.utime(h.home / "config.yaml", (ENABLED_AT, ENABLED_AT))
    yield h
    h.close()


@pytest.mark.parametrize("cfg,expected", [
    ({}, []),
    ({"plugins": {"enabled": ["session-guard"]}}, []),
    ({"plugins": {"isolation": "host"}}, ["plugins.isolation: host"]),
    ({"plugins": {"isolation": "none"}}, []),
    ({"plugins": {"isolation": False}}, []),
    ({"dashboard": {"turn_isolation": True}}, ["dashboard.turn_isolation: True"]),
    ({"dashboard": {"turn_isolation": "off"}}, []),
    ({"plugins": ["not", "a", "mapping"], "dashboard": None}, []),
])
def test_the_turn_isolation_settings_are_read_from_config(cfg: dict, expected: list[str]) -> None:
    assert isolation_settings(cfg) == expected


def test_doctor_lists_turn_isolation_as_a_configuration_finding() -> None:
    (finding,) = isolation_findings({"plugins": {"enabled": ["session-guard"], "isolation": "host"}})
    assert finding.signature == "turns_isolated" and finding.key == "plugins.isolation"
    assert "cannot see" in finding.detail and finding.config_lines == SEED_LINES["turns_isolated"]
    assert isolation_findings({"plugins": {"enabled": ["session-guard"]}}) == []


def test_compactions_before_enable_are_not_counted(hermes: HermesLikeHome) -> None:
    hermes.session("old", 1.0, ended=500.0, reason="compression")
    hermes.session("old-child", 500.0, parent="old")
    hermes.messages("old-child", ["q", SUMMARY + " 1"], 500.5)
    assert unguarded_compactions(hermes.db_path, ENABLED_AT) == {}
    report = turns_elsewhere(hermes.home)
    assert report["checked"] and not report["found"]


def test_a_rotation_after_enable_is_one_unguarded_compaction_with_its_child_not_counted_again(
        hermes: HermesLikeHome) -> None:
    hermes.session("p", 900.0, ended=1500.0, reason="compression")
    hermes.session("c", 1500.0, parent="p")
    hermes.messages("c", ["head", SUMMARY + " of p", "q", "a"], 1500.5)
    assert unguarded_compactions(hermes.db_path, ENABLED_AT) == {"p": 1}
    report = turns_elsewhere(hermes.home)
    assert report["found"] and report["sessions"] == ["p"] and report["unguarded_compactions"] == 1
    assert report["line"].startswith("NOT PROTECTED: Hermes runs turns the guard cannot see")
    assert "restart every Hermes process" in report["line"]


def test_in_place_summaries_beyond_the_guards_records_are_unguarded(hermes: HermesLikeHome) -> None:
    hermes.session("s", 900.0)
    hermes.messages("s", ["q", SUMMARY + " one", "q2", SUMMARY + " one"], 1100.0)  # a carried copy counts once
    hermes.messages("s", [SUMMARY + " two"], 1200.0)
    assert unguarded_compactions(hermes.db_path, ENABLED_AT) == {"s": 2}
    store = GuardStore(hermes.db_path)
    try:
        with store.transaction() as conn:
            conn.execute("INSERT INTO session_guard_compressions(op_id, session_id, phase, started_at) "
                         "VALUES ('op1', 's', 'done', 1099.0)")
    finally:
        store.close()
    assert unguarded_compactions(hermes.db_path, ENABLED_AT) == {"s": 1}


def test_a_summary_copied_into_another_session_is_not_another_compaction(hermes: HermesLikeHome) -> None:
    hermes.session("s", 900.0, ended=1300.0, reason="handoff")
    hermes.messages("s", ["q", SUMMARY + " one"], 1100.0)
    hermes.session("child", 1300.0, parent="s")
    hermes.messages("child", ["q", SUMMARY + " one", "next"], 1300.0)  # a hand-off child's seed
    assert unguarded_compactions(hermes.db_path, ENABLED_AT) == {"s": 1}


def test_the_settings_alone_are_a_finding(hermes: HermesLikeHome) -> None:
    (hermes.home / "config.yaml").write_text("plugins:\n  enabled: [session-guard]\n  isolation: host\n",
                                             encoding="utf-8")
    report = turns_elsewhere(hermes.home)
    assert report["found"] and report["settings"] == ["plugins.isolation: host"] and not report["sessions"]
    assert "remove plugins.isolation" in report["line"]


def test_an_unreadable_config_is_not_checked(hermes: HermesLikeHome) -> None:
    (hermes.home / "config.yaml").write_text("plugins: [unclosed\n", encoding="utf-8")
    report = turns_elsewhere(hermes.home)
    assert not report["checked"] and not report["found"] and "config.yaml" in report["reason"]
