"""doctor's configuration findings against the installed release's own rules
(DEFAULT_CONFIG, ContextCompressor thresholds, gateway hygiene, custom providers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_session_guard.commands import cli
from hermes_session_guard.maintenance.config_findings import SEED_LINES, check_config, load_host_rules

URL = "http://127.0.0.1:9/v1"

GOOD: dict[str, Any] = {
    "model": {"default": "main-model", "provider": "custom", "base_url": URL, "context_length": 128_000},
    "auxiliary": {"compression": {"provider": "custom", "model": "summary-model", "base_url": URL,
                                  "context_length": 200_000, "timeout": 300}},
    "compression": {"enabled": True, "threshold": 0.5},
    "plugins": {"enabled": ["session-guard"]},
}


@pytest.fixture(scope="module")
def rules() -> Any:
    found = load_host_rules()
    assert found is not None, "the installed Hermes could not be read"
    return found


def _with(**changes: Any) -> dict[str, Any]:
    cfg = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return cfg


def _signatures(cfg: dict[str, Any], rules: Any) -> list[str]:
    return [f.signature for f in check_config(cfg, rules)]


def test_rules_come_from_the_installed_release(rules: Any) -> None:
    assert rules.hygiene_percent == 0.85  # gateway/run.py's _hyg_threshold_pct
    assert rules.minimum_context == 64_000
    assert rules.defaults["auxiliary"]["compression"]["timeout"] == 120  # the default seed 001 warns about
    assert rules.context_table  # agent.model_metadata.DEFAULT_CONTEXT_LENGTHS
    # the release's own threshold arithmetic for a 128K main model (0.19 floors windows under
    # 512K at 75 %: the module's _SMALL_CTX_THRESHOLD_PERCENT)
    import agent.context_compressor as compressor

    expected = 96_000 if getattr(compressor, "_SMALL_CTX_THRESHOLD_PERCENT", None) == 0.75 else 64_000
    assert rules.threshold(128_000, 0.5) == expected


def test_a_good_config_has_no_finding(rules: Any) -> None:
    assert check_config(GOOD, rules) == []


CASES = {
    "compression_disabled": dict(compression__enabled=False),
    "aux_compression_model_unset": dict(auxiliary__compression__model=None),
    "aux_compression_window_too_small": dict(auxiliary__compression__context_length=48_000),
    "aux_compression_window_unknown": dict(auxiliary__compression__context_length=None),
    "aux_compression_timeout_low": dict(auxiliary__compression__timeout=120),
    "custom_provider_no_context_length": dict(
        custom_providers=[{"name": "proxy", "base_url": "http://127.0.0.1:8/v1", "model": "m"}]),
    "threshold_above_hygiene": dict(compression__threshold=0.9),
    "protected_exceeds_budget": dict(compression__protect_first_n=3, compression__protect_last_n=20,
                                     compression__hygiene_hard_message_limit=24),
}


@pytest.mark.parametrize("signature", sorted(CASES))
def test_each_finding_from_a_crafted_config(rules: Any, signature: str) -> None:
    findings = check_config(_with(**CASES[signature]), rules)
    assert [f.signature for f in findings] == [signature], [f.as_dict() for f in findings]
    (f,) = findings
    assert f.key.split("[")[0].split(".")[0] in ("compression", "auxiliary", "custom_providers", "model")
    assert f.key.split(".")[-1] in f.fix  # the one-line fix names the config key
    assert f.config_lines == SEED_LINES[signature]


def test_hermes_default_timeout_is_flagged_when_unset(rules: Any) -> None:
    findings = check_config(_with(auxiliary__compression__timeout=None), rules)
    (f,) = findings
    assert f.signature == "aux_compression_timeout_low" and "default 120" in f.detail
    assert "timeout: 300" in f.config_lines


def test_a_too_small_window_names_the_threshold_in_tokens(rules: Any) -> None:
    (f,) = check_config(_with(auxiliary__compression__context_length=48_000), rules)
    threshold = rules.threshold(128_000, 0.5)
    assert f"{threshold:,}" in f.detail and "48,000" in f.detail


def test_custom_main_model_without_context_length(rules: Any) -> None:
    cfg = _with(model__context_length=None, model__default="my-local-llm")
    sigs = _signatures(cfg, rules)
    assert "custom_provider_no_context_length" in sigs
    # with the window declared per model under custom_providers, it is known again
    cfg["custom_providers"] = [{"name": "local", "base_url": URL,
                                "models": {"my-local-llm": {"context_length": 128_000}}}]
    assert _signatures(cfg, rules) == []


def test_a_small_tail_budget_room_check(rules: Any) -> None:
    # target_ratio is clamped to 0.80 by the compressor; with a big summary share there is no room
    cfg = _with(compression__target_ratio=0.95, model__context_length=1_000_000,
                auxiliary__compression__context_length=1_000_000, compression__threshold=0.05)
    assert "protected_exceeds_budget" in _signatures(cfg, rules)


def _doctor(home: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    monkeypatch.setenv("HERMES_HOME", str(home))
    capsys.readouterr()
    code = cli.main(argv)
    return code, capsys.readouterr().out


def test_doctor_reports_config_findings_as_warnings(
    db: Any, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = yaml.safe_load((home / "config.yaml").read_text(encoding="utf-8"))
    cfg.setdefault("compression", {})["enabled"] = False
    (home / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    db.create_session(session_id="s1", source="cli", model="fake-model")

    code, out = _doctor(home, ["doctor", "--json"], monkeypatch, capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"] is True  # warnings: existing scripts keep working
    assert report["config"]["checked"] and "compression_disabled" in [
        f["signature"] for f in report["config"]["findings"]]
    code, out = _doctor(home, ["doctor", "--json", "--strict"], monkeypatch, capsys)
    assert code == 1 and json.loads(out)["ok"] is False
    code, out = _doctor(home, ["doctor"], monkeypatch, capsys)
    assert code == 0 and "[compression_disabled]" in out and "compression:\n      enabled: true" in out
    assert "doctor: no corruption found" in out
    assert _doctor(home, ["doctor", "--strict"], monkeypatch, capsys)[0] == 1

    (home / "config.yaml").write_text(yaml.safe_dump(GOOD), encoding="utf-8")
    code, out = _doctor(home, ["doctor", "--strict"], monkeypatch, capsys)
    assert code == 0 and "no findings" in out


SEED_001 = _with(auxiliary__compression__context_length=None, auxiliary__compression__timeout=None)


def test_doctor_reports_config_findings_before_the_first_session(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new install: config.yaml, no state.db yet. The findings seed 001 needed are reported
    (not "nothing to check yet"), and doctor creates no state.db."""
    (home / "config.yaml").write_text(yaml.safe_dump(SEED_001), encoding="utf-8")
    assert not (home / "state.db").exists()
    code, out = _doctor(home, ["doctor"], monkeypatch, capsys)
    assert code == 0, out
    assert "[aux_compression_timeout_low]" in out and "[aux_compression_window_unknown]" in out, out
    assert "timeout: 300" in out and "nothing to check yet" not in out
    assert _doctor(home, ["doctor", "--strict"], monkeypatch, capsys)[0] == 1
    code, out = _doctor(home, ["doctor", "--json"], monkeypatch, capsys)
    report = json.loads(out)
    assert code == 0 and report["state_db_exists"] is False
    assert sorted(f["signature"] for f in report["config"]["findings"]) == [
        "aux_compression_timeout_low", "aux_compression_window_unknown"]
    assert not (home / "state.db").exists()

    (home / "config.yaml").write_text(yaml.safe_dump(GOOD), encoding="utf-8")
    code, out = _doctor(home, ["doctor", "--strict"], monkeypatch, capsys)
    assert code == 0 and "no findings" in out, out


@pytest.mark.parametrize("with_db", [False, True], ids=["no-state-db", "state-db"])
def test_doctor_names_an_invalid_guard_option_and_the_default_used(
    db: Any, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], with_db: bool
) -> None:
    cfg = _with(session_guard={"lock": {"wait_seconds": float("inf")}, "recall": {"max_chars": 500}})
    (home / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    if with_db:
        db.create_session(session_id="s1", source="cli", model="fake-model")
    else:
        db.close()
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (home / name).unlink(missing_ok=True)
    code, out = _doctor(home, ["doctor"], monkeypatch, capsys)
    assert code == 0, out  # a warning: the guard runs, on the default
    assert "[guard_option_invalid]" in out and "session_guard.lock.wait_seconds = inf" in out, out
    assert "default 2.0" in out and "wait_seconds: 2.0" in out
    code, out = _doctor(home, ["doctor", "--json", "--strict"], monkeypatch, capsys)
    report = json.loads(out)
    assert code == 1
    (finding,) = report["config"]["findings"]
    assert (finding["signature"], finding["key"]) == ("guard_option_invalid", "session_guard.lock.wait_seconds")
