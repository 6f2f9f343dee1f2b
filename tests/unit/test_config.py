from __future__ import annotations

from pathlib import Path

import pytest

from hermes_session_guard.config import (
    BufferConfig,
    ConfigError,
    GuardConfig,
    LockConfig,
    load_config,
    parse_config,
)


def test_absent_section_means_defaults() -> None:
    assert parse_config(None) == GuardConfig()
    assert parse_config({}).enabled is True


def test_nested_values_are_parsed() -> None:
    cfg = parse_config({"lock": {"wait_seconds": 5}, "summaries": {"visible": "tagged"}, "enabled": False,
                        "events": {"chat_completions_records": True}})
    assert cfg.lock.wait_seconds == 5.0 and cfg.summaries.visible == "tagged" and cfg.enabled is False
    assert cfg.events.chat_completions_records is True and GuardConfig().events.chat_completions_records is False


@pytest.mark.parametrize(
    ("raw", "key", "field", "default"),
    [
        ({"lock": {"wait_seconds": "soon"}}, "session_guard.lock.wait_seconds", ("lock", "wait_seconds"), 2.0),
        ({"lock": {"wait_seconds": -1}}, "session_guard.lock.wait_seconds", ("lock", "wait_seconds"), 2.0),
        ({"lock": {"wait_seconds": float("inf")}}, "session_guard.lock.wait_seconds", ("lock", "wait_seconds"), 2.0),
        ({"lock": {"wait_seconds": 1e10}}, "session_guard.lock.wait_seconds", ("lock", "wait_seconds"), 2.0),
        ({"lock": []}, "session_guard.lock", ("lock",), LockConfig()),
        ({"buffer": {"max_messages": 1.5}}, "session_guard.buffer.max_messages", ("buffer", "max_messages"), 0),
        ({"buffer": {"enabled": "yes"}}, "session_guard.buffer.enabled", ("buffer", "enabled"), True),
        ({"events": {"chat_completions_records": "on"}}, "session_guard.events.chat_completions_records",
         ("events", "chat_completions_records"), False),
        ({"handoff": {"mode": "sometimes"}}, "session_guard.handoff.mode", ("handoff", "mode"), "prompt_user"),
        ({"handoff": {"artifact_dir": "../out"}}, "session_guard.handoff.artifact_dir", ("handoff", "artifact_dir"),
         "handoffs"),
        ({"buffer": {"overflow_text": "{nope}"}}, "session_guard.buffer.overflow_text", ("buffer", "overflow_text"),
         BufferConfig().overflow_text),
    ],
)
def test_a_bad_option_keeps_its_default_and_is_reported(raw: dict, key: str, field: tuple[str, ...],
                                                       default: object) -> None:
    cfg = parse_config({**raw, "recall": {"max_chars": 500}})
    value: object = cfg
    for name in field:
        value = getattr(value, name)
    assert value == default
    assert cfg.enabled is True and cfg.recall.max_chars == 500  # the good options still apply
    assert [f.key for f in cfg.fallbacks] == [key]
    fallback = cfg.fallbacks[0]
    assert fallback.default == default and not fallback.unknown
    text = fallback.describe()
    assert key in text and fallback.value in text and f"default {default!r}"[:40] in text


def test_an_unknown_option_is_ignored_and_reported() -> None:
    cfg = parse_config({"locks": {}, "lock": {"wait_secnds": 5, "wait_seconds": 7}, "fallbacks": []})
    assert cfg.lock.wait_seconds == 7.0
    assert [(f.key, f.unknown) for f in cfg.fallbacks] == [
        ("session_guard.locks", True), ("session_guard.lock.wait_secnds", True), ("session_guard.fallbacks", True)]
    assert "ignored" in cfg.fallbacks[0].describe()


def test_a_clean_config_has_no_fallbacks() -> None:
    assert parse_config({"lock": {"wait_seconds": 5}}).fallbacks == ()


def test_only_enabled_switches_the_guard_off() -> None:
    assert parse_config({"enabled": False, "lock": {"wait_seconds": float("nan")}}).enabled is False
    with pytest.raises(ConfigError) as err:  # neither on nor off: never guessed
        parse_config({"enabled": "yes"})
    assert err.value.key == "session_guard.enabled"


def test_section_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config(["enabled"])


def test_load_config_reads_config_yaml(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("session_guard:\n  recall:\n    max_chars: 500\n", encoding="utf-8")
    assert load_config(tmp_path).recall.max_chars == 500
    assert load_config(tmp_path / "missing") == GuardConfig()


def test_load_config_reports_broken_yaml(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("session_guard: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path)


def test_load_config_falls_back_on_inf(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("session_guard:\n  lock:\n    wait_seconds: .inf\n", encoding="utf-8")
    cfg = load_config(tmp_path)
    assert cfg.enabled is True and cfg.lock.wait_seconds == 2.0
    assert [(f.key, f.value) for f in cfg.fallbacks] == [("session_guard.lock.wait_seconds", "inf")]
