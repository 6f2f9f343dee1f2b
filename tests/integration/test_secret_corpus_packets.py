"""The secret corpus through the real host: packets written by ``handoff`` (the form in
the note and in the last user request, with Hermes's own redactor in the chain), the
compaction summary of an automatic hand-off, and the audit events of those runs; the
controls reach the packet unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import host
from hermes_session_guard.config import GuardConfig, parse_config
from hermes_session_guard.handoff.redaction import normalise
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer

from .conftest import new_agent

CORPUS = json.loads((Path(__file__).parents[1] / "fixtures" / "secrets_corpus.json").read_text(encoding="utf-8"))
SECRETS: list[dict[str, str]] = CORPUS["secrets"]
CONTROLS: list[str] = CORPUS["controls"]
HELD_OUT: list[dict[str, str]] = CORPUS["held_out"]
SID = "20260604_100000_eeeeee"


def leaked(out: str, secret: str) -> bool:
    out = normalise(out)
    if secret in out:
        return True
    return len(secret) >= 12 and any(secret[i:i + 8] in out for i in range(len(secret) - 7))


def _lines_with(text: str, secret: str) -> list[str]:
    return [line for line in text.splitlines() if secret[:6] in normalise(line)]


def test_hermes_redactor_is_found_on_this_release() -> None:
    assert host.host_redactor() is not None


def test_every_form_in_a_note_and_a_request_is_redacted(guard: Any, db: Any, home: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.commands.cli import main

    messages = probe.seed_messages(4)
    probe.seed_session(db, SID, messages)
    packets = []
    for entry in SECRETS:
        db.append_message(session_id=SID, role="user", content=f"please use this: {entry['text']}")
        db.append_message(session_id=SID, role="assistant", content="noted")
        assert main(["handoff", SID, "--note", entry["text"]]) == 0
        path = Path(capsys.readouterr().out.strip())
        packets.append(path)
        text = path.read_text(encoding="utf-8")
        assert not leaked(text, entry["secret"]), (entry["name"], _lines_with(text, entry["secret"]))
        note = text.split("## Note", 1)[1].split("## Last user request", 1)[0]
        assert "[REDACTED]" in note or "***" in note  # the guard's mask, or the host's over it
    assert len(set(packets)) == len(SECRETS)
    audit_log = (home / "logs" / "session_guard.jsonl").read_text(encoding="utf-8")
    for entry in SECRETS:
        assert not leaked(audit_log, entry["secret"]), entry["name"]


def test_held_out_forms_in_a_note_and_a_request_are_masked(guard: Any, db: Any, home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The forms the rules were not tuned on, through ``handoff`` with Hermes's redactor in
    the chain: at least 95 % masked in both fields."""
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    missed = []
    for entry in HELD_OUT:
        db.append_message(session_id=SID, role="user", content=entry["text"])
        db.append_message(session_id=SID, role="assistant", content="noted")
        assert main(["handoff", SID, "--note", entry["text"]]) == 0
        text = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
        if leaked(text, entry["secret"]):
            missed.append(entry["name"])
    fraction = 1 - len(missed) / len(HELD_OUT)
    print(f"held-out forms masked in note and request: {len(HELD_OUT) - len(missed)}/{len(HELD_OUT)} ({fraction:.1%})")
    assert fraction >= 0.95, missed


def test_controls_reach_the_packet_unchanged(guard: Any, db: Any, home: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    for control in CONTROLS:
        assert main(["handoff", SID, "--note", control]) == 0
        text = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
        assert f"## Note\n\n{control.strip()}\n" in text, control


@pytest.fixture
def summarising_secrets(guard: Any, llm: FakeLLMServer) -> Iterator[Any]:
    import hermes_session_guard

    summary = "## Goal\nKeep going.\n\n## Relevant Files\n" + "\n".join(f"- {e['text']}" for e in SECRETS) + "\n"
    llm.configure(summary_text=summary)
    runtime = hermes_session_guard.install(parse_config({"handoff": {"enabled": True, "after_compressions": 1}}))
    yield runtime
    hermes_session_guard.install(GuardConfig())


def test_an_automatic_packet_redacts_the_summary(summarising_secrets: Any, db: Any, llm: FakeLLMServer,
                                                  home: Path) -> None:
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    (path,) = sorted((home / "handoffs").glob("*.md"))
    text = path.read_text(encoding="utf-8")
    assert "## Latest summary" in text and "Keep going." in text
    for entry in SECRETS:
        assert not leaked(text, entry["secret"]), (entry["name"], _lines_with(text, entry["secret"]))
    audit_log = (home / "logs" / "session_guard.jsonl").read_text(encoding="utf-8")
    assert "handoff.packet_written" in audit_log
    for entry in SECRETS:
        assert not leaked(audit_log, entry["secret"]), entry["name"]
