"""``hermes-session-guard demo``: both anomalies on the installed Hermes, guard off then
on, parsed from ``--json``: the off column shows the anomalies on a rotating release,
the on column is clean; the table prints both side by side."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_session_guard.commands import cli
from hermes_session_guard.commands.demo import print_table

from .conftest import HOST_HAS_IN_PLACE, HOST_ROW

# Hermes's own compression_locks (0.16+, the seam table's lock mode; held by Hermes alone in native
# mode, 0.20+): one summary call unguarded too.
NATIVE_LOCK = HOST_ROW is not None and HOST_ROW.behaviour.lock in ("native", "host")


def _demo(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main(["demo", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def _assert_clean(col: dict[str, Any]) -> None:
    assert col["clean"], col["problems"]
    assert col["ids_after"] == [col["id_before"]] and col["forks"] == 0
    assert col["summary_calls"] == 1 and col["messages_lost"] == [] and col["summaries_visible"] == 0
    assert col["turns_left_behind"] == 0
    assert {ln.split("session=", 1)[1] for ln in col["host_log"]} == {col["id_before"]}
    assert all(ln.startswith(f"[{col['id_before']}]") for ln in col["host_log"])


def test_demo_shows_both_anomalies_without_the_guard_and_none_with_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _demo([], capsys)
    assert code == 0 and report["ok"], report
    assert report["mode"] == "rotate"  # 0.18.2+ are put in their rotating mode unless --release-default
    a, b = report["scenarios"]
    # anomaly A: the done line names another id than the started line; the gateway follows the fork
    off = a["off"]
    assert off["forks"] == 1 and not off["clean"]
    assert len({ln.split("session=", 1)[1] for ln in off["host_log"]}) >= 2
    if off["ids_after"] != [off["id_before"]]:  # the gateway followed the fork (not 0.17's gateway)
        assert off["turns_left_behind"] > 0
        # the fork's untagged summary row: 1 on 0.14, 0.15 and 0.19 rotating; 0.18.0's demo showed 0
        assert off["summaries_visible"] <= 1
    _assert_clean(a["on"])
    assert a["on"]["replies"] == ["re: trigger-a", "re: followup-a"]
    # anomaly B: the compression lines carry another session's tag; forks of one session
    off = b["off"]
    # (the stale tag is the one the pool thread last served; Hermes 0.20+ keeps the log tag per process, where
    # it is the tag an earlier conversation of the demo left)
    assert off["forks"] >= 1 and any(ln.startswith("[") and ln[1:].split("]", 1)[0] not in ("-", off["id_before"])
                                     and f"started session={off['id_before']}" in ln for ln in off["host_log"])
    if not NATIVE_LOCK:  # 0.13-0.15 have no native lock: two summaries, two children, the message lost
        assert off["forks"] == 2 and off["summary_calls"] == 2 and off["messages_lost"] == ["arriving-b:"]
    _assert_clean(b["on"])

    print_table(report)
    table = capsys.readouterr().out
    assert "Anomaly A" in table and "Anomaly B" in table and "guard off" in table and "guard on" in table
    assert "(CHANGED)" in table and "demo: guard on CLEAN in every scenario" in table


@pytest.mark.skipif(not HOST_HAS_IN_PLACE, reason="only 0.18.2+ keep the id themselves")
def test_release_default_on_an_in_place_release(capsys: pytest.CaptureFixture[str]) -> None:
    """Hermes's own default keeps the id through compaction: the off column then shows no
    fork in A; what it still shows is the stale log tag of B's executor threads."""
    code, report = _demo(["--release-default"], capsys)
    assert code == 0 and report["mode"] == "in_place"
    a, b = report["scenarios"]
    assert a["off"]["ids_after"] == [a["off"]["id_before"]] and a["off"]["forks"] == 0
    for s in (a, b):
        _assert_clean(s["on"])
