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
ORDINARY: list[str] = CORPUS["ordinary"]
# each held-out set and the fraction masked in the note and the request it is held at
# (tests/unit/test_secret_corpus.py, docs/redaction.md)
HELD_OUT_SETS = {"held_out": 0.97, "held_out_2": 0.97, "held_out_3": 0.97, "held_out_4": 0.97,
                 "held_out_5": 0.97}
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


@pytest.mark.parametrize("name", HELD_OUT_SETS)
def test_held_out_forms_in_a_note_and_a_request_are_masked(guard: Any, db: Any, home: Path,
                                                           capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The forms the rules were not tuned on, through ``handoff`` with Hermes's redactor in
    the chain, masked in both fields at the set's measured fraction."""
    from hermes_session_guard.commands.cli import main

    held_out = CORPUS[name]
    probe.seed_session(db, SID, probe.seed_messages(4))
    missed = []
    for entry in held_out:
        db.append_message(session_id=SID, role="user", content=entry["text"])
        db.append_message(session_id=SID, role="assistant", content="noted")
        assert main(["handoff", SID, "--note", entry["text"]]) == 0
        text = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
        if leaked(text, entry["secret"]):
            missed.append(entry["name"])
    fraction = 1 - len(missed) / len(held_out)
    print(f"{name}: masked in note and request {len(held_out) - len(missed)}/{len(held_out)} ({fraction:.1%})")
    assert fraction >= HELD_OUT_SETS[name], missed


def test_ordinary_texts_reach_the_packet_nearly_unchanged(guard: Any, db: Any, home: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """At most 1 of the 22 ordinary technical texts is changed in the note, Hermes's pass included."""
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    changed = []
    for text in ORDINARY:
        assert main(["handoff", SID, "--note", text]) == 0
        packet = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
        if f"## Note\n\n{text.strip()}\n" not in packet:
            changed.append(text)
    print(f"ordinary texts changed in the packet: {len(changed)}/{len(ORDINARY)}")
    assert len(changed) <= 1, changed


def test_a_url_with_credentials_never_removes_a_section(guard: Any, db: Any, home: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Hermes 0.14's connection-string rule runs over line ends: applied to the whole
    packet after the guard's, it deleted from the note's URL to the request's, the "Last
    user request" heading included. Now it runs line by line."""
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    url = "postgres://app:Sup3rPa55w0rd@db.internal:5432/app"
    db.append_message(session_id=SID, role="user", content=f"then migrate {url} too: ok")
    assert main(["handoff", SID, "--note", f"the database is {url}\nport 5432: primary"]) == 0
    packet = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
    for heading in ("## Note", "## Last user request", "## Todo list", "## Latest summary", "## Open questions"):
        assert heading in packet, packet
    assert "then migrate" in packet and "Sup3rPa55w0rd" not in packet


def test_hermes_pass_never_sees_a_long_token_whole(guard: Any, db: Any, home: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A 240 KB single-token note (Hermes's redactor is quadratic on it): each piece Hermes's
    pass is given is bounded, and the packet's note is clipped."""
    from hermes_session_guard.commands.cli import main
    from hermes_session_guard.handoff import redaction

    real = host.host_redactor()
    assert real is not None
    seen: list[int] = []

    def spy(text: str) -> str:
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(host, "host_redactor", lambda: spy)
    probe.seed_session(db, SID, probe.seed_messages(4))
    token = "Ab3dEf6h" * 30_000
    assert main(["handoff", SID, "--note", token]) == 0
    packet = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
    assert seen and max(seen) <= redaction.HOST_PASS_MAX_LINE
    assert len(packet) < 20_000


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


def test_a_value_seen_with_its_context_is_masked_where_it_is_echoed(guard: Any, db: Any, home: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The password given as ``DB_PASSWORD=...`` early in the session, echoed bare in the last
    request and in the note: masked in both."""
    from hermes_session_guard.commands.cli import main

    probe.seed_session(db, SID, probe.seed_messages(4))
    value = "Qx7mK2pL9vR4tW"
    db.append_message(session_id=SID, role="user", content=f"the staging env has DB_PASSWORD={value} set")
    db.append_message(session_id=SID, role="assistant", content="noted")
    db.append_message(session_id=SID, role="user", content=f"now try {value} against the replica")
    assert main(["handoff", SID, "--note", f"remember {value} is the one"]) == 0
    packet = Path(capsys.readouterr().out.strip()).read_text(encoding="utf-8")
    assert value not in packet
    assert "against the replica" in packet and "is the one" in packet
