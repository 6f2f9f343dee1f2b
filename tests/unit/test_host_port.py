"""summaries/ reads Hermes only through what the package binds into summaries.host_port."""

from __future__ import annotations

from pathlib import Path

import pytest

import hermes_session_guard
from hermes_session_guard import host
from hermes_session_guard.summaries import host_port, recall_tool, tags


def test_the_package_binds_host_at_import() -> None:
    assert hermes_session_guard is not None
    assert host_port.bound() is host
    assert host_port.summary_prefixes() == host.summary_prefixes()
    assert host_port.NATIVE_SUMMARY_KEY == host.NATIVE_SUMMARY_KEY


def test_unbound_markers_fall_back_and_reads_say_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_port, "_bound", None)
    assert host_port.summary_prefixes() == host_port.DEFAULT_SUMMARY_PREFIXES
    assert host_port.merged_summary_markers() == host_port.DEFAULT_MERGED_MARKERS
    assert tags.is_summary_text(f"{host_port.DEFAULT_SUMMARY_PREFIXES[1]} body")
    with pytest.raises(host_port.HostNotBound, match="host/"):
        recall_tool.lineage(Path("/nonexistent/state.db"), "s1")


def test_a_patched_host_name_is_seen_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "compression_ancestors", lambda db_path, sid, limit=64: ["parent-of-" + sid])
    assert recall_tool.lineage(Path("/nonexistent/state.db"), "s1") == ["s1", "parent-of-s1"]
    monkeypatch.setattr(host, "summary_prefixes", lambda: ("[MINE]",))
    assert tags.is_summary_text("[MINE] x") and not tags.is_summary_text("[CONTEXT SUMMARY]: x")
