"""The command table: every operator command is registered and speaks JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_session_guard.commands import cli


def test_every_command_is_registered_with_json_output() -> None:
    assert {"selftest", "doctor", "repair", "status", "snapshots"} <= set(cli.COMMANDS)
    parser = cli.build_parser()
    for name in ("selftest", "doctor", "repair", "status"):
        args = parser.parse_args([name, "--json"])
        assert args.json is True and args.guard_handler is cli.COMMANDS[name].run
    assert parser.parse_args(["repair"]).apply is False
    assert parser.parse_args(["repair", "--apply"]).apply is True


def test_hermes_subcommand_registration_uses_the_same_table() -> None:
    registered: dict[str, object] = {}

    class Ctx:
        def register_cli_command(self, name: str, help: str, setup, handler, description: str = "") -> None:  # noqa: A002,ANN001
            import argparse

            p = argparse.ArgumentParser(prog=f"hermes {name}")
            setup(p)
            registered.update(name=name, parser=p, handler=handler)

    cli.register_cli(Ctx())
    assert registered["name"] == "session-guard"
    args = registered["parser"].parse_args(["doctor", "--json"])  # type: ignore[attr-defined]
    assert args.guard_handler is cli.COMMANDS["doctor"].run


@pytest.mark.parametrize("config, expected", [
    (None, "does not exist"),
    ("session_guard:\n  enabled: maybe\n", "session_guard.enabled"),
])
def test_selftest_refuses_a_bad_home_before_probing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], config: str | None,
                                                    expected: str) -> None:
    home = tmp_path / "home"
    if config is not None:
        home.mkdir()
        (home / "config.yaml").write_text(config, encoding="utf-8")
    monkeypatch.setenv("HERMES_HOME", str(home))
    assert cli.main(["selftest", "--json"]) == 2
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is False and expected in payload["error"]
