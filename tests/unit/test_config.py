from __future__ import annotations

from pathlib import Path

import pytest

from hermes_session_guard.config import ConfigError, GuardConfig, load_config, parse_config


def test_absent_section_means_defaults() -> None:
    assert parse_config(None) == GuardConfig()
    assert parse_config({}).enabled is True


def test_nested_values_are_parsed() -> None:
    cfg = parse_config({"lock": {"wait_seconds": 5}, "summaries": {"visible": "tagged"}, "enabled": False})
    assert cfg.lock.wait_seconds == 5.0 and cfg.summaries.visible == "tagged" and cfg.enabled is False


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"enabled": "yes"}, "session_guard.enabled"),
        ({"lock": {"wait_seconds": "soon"}}, "session_guard.lock.wait_seconds"),
        ({"lock": {"wait_seconds": -1}}, "session_guard.lock.wait_seconds"),
        ({"lock": []}, "session_guard.lock"),
        ({"buffer": {"max_messages": 1.5}}, "session_guard.buffer.max_messages"),
        ({"handoff": {"mode": "sometimes"}}, "session_guard.handoff.mode"),
        ({"locks": {}}, "session_guard.locks"),
    ],
)
def test_bad_values_name_the_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert err.value.key == key
    assert key in str(err.value)


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
