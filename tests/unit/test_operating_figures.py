"""Config findings under hand-written release rules (no Hermes), and status's figures:
p95, causes, holder liveness."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hermes_session_guard.locks import liveness
from hermes_session_guard.locks.liveness import holder_liveness
from hermes_session_guard.maintenance.config_findings import HostRules, check_config
from hermes_session_guard.maintenance.session_pressure import compression_history, p95

RULES = HostRules(
    version="test",
    defaults={"compression": {"enabled": True, "threshold": 0.5, "target_ratio": 0.2, "protect_first_n": 3,
                              "protect_last_n": 20, "hygiene_hard_message_limit": 400},
              "auxiliary": {"compression": {"provider": "auto", "model": "", "timeout": 120}}},
    hygiene_percent=0.85,
    minimum_context=64_000,
    context_table={"big-model": 1_000_000, "small-model": 32_000},
)
GOOD = {
    "model": {"default": "big-model", "provider": "openrouter"},
    "auxiliary": {"compression": {"model": "big-model", "timeout": 600}},
}


def test_rules_without_hermes_apply_the_old_threshold_arithmetic() -> None:
    assert RULES.threshold(128_000, 0.5) == 64_000  # floored at MINIMUM_CONTEXT_LENGTH
    assert RULES.threshold(1_000_000, 0.5) == 500_000
    assert check_config(GOOD, RULES) == []


def test_a_summary_model_from_the_model_table_below_the_threshold() -> None:
    cfg = json.loads(json.dumps(GOOD))
    cfg["auxiliary"]["compression"]["model"] = "small-model"
    (f,) = check_config(cfg, RULES)
    assert f.signature == "aux_compression_window_too_small" and "32,000" in f.detail and "500,000" in f.detail


def test_the_release_default_timeout_and_an_unset_model_are_both_reported() -> None:
    sigs = [f.signature for f in check_config({"model": {"default": "big-model"}}, RULES)]
    assert sigs == ["aux_compression_model_unset", "aux_compression_timeout_low"]


def test_disabled_compression_is_reported_once_and_nothing_that_needs_it() -> None:
    cfg = {**GOOD, "compression": {"enabled": "false", "threshold": 0.95}}
    assert [f.signature for f in check_config(cfg, RULES)] == ["compression_disabled"]


def test_p95_is_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([5.0]) == 5.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([1.0, 2.0]) == 2.0


def test_history_counts_outcomes_causes_and_durations(tmp_path: Path) -> None:
    log = tmp_path / "session_guard.jsonl"
    events = [
        {"event": "compression.started", "session_id": "s"},
        {"event": "compression.done", "session_id": "s", "duration_ms": 120.0},
        {"event": "compression.skipped", "session_id": "s", "reason": "another operation holds this lock"},
        {"event": "compression.failed", "session_id": "s", "reason": "HTTP 500"},
        {"event": "compression.done", "session_id": "s", "duration_ms": 80.0},
        {"event": "compression.adopted", "session_id": "s"},
        {"event": "compression.done", "session_id": "t", "duration_ms": 1.0},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events) + "garbage\n", encoding="utf-8")
    h = compression_history(log)["s"].as_dict()
    assert (h["done"], h["failed"], h["skipped"], h["adopted"]) == (2, 1, 1, 1)
    assert h["last_duration_ms"] == 80.0 and h["p95_duration_ms"] == 120.0
    assert h["causes"] == {"skipped": {"another operation holds this lock": 1}, "failed": {"HTTP 500": 1}}


def test_holder_liveness_from_the_identity_in_the_holder_id() -> None:
    me = liveness.this_process()
    gone = liveness.ProcessIdentity(me.host, me.boot, 999_999_999, me.start)
    assert holder_liveness(f"pid={os.getpid()}:tid=1:guard-op=x:{me.fields()}") == "alive"
    assert holder_liveness(f"pid=999999999:tid=1:guard-op=x:{gone.fields()}") == "dead"
    # Hermes's own pid-only holders are judged on this machine: pid gone, dead; pid running, the lease decides.
    assert holder_liveness("pid=999999999:tid=1:agent=x") == "dead"
    assert holder_liveness(f"pid={os.getppid()}:tid=1:agent=x") == "unknown"
    assert holder_liveness("some-other-holder") == "unknown" and holder_liveness(None) == "unknown"
