"""The secret corpus (tests/fixtures/secrets_corpus.json, one entry per secret form)
through every pass of the guard's redaction, the hand-off packet's fields (redacted
before they are clipped) and audit events; the non-secret controls come out unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.audit import AuditLog, read_events
from hermes_session_guard.handoff import redaction
from hermes_session_guard.handoff.packet import MAX_NOTE_CHARS, MAX_REQUEST_CHARS, PacketInputs, render_packet
from hermes_session_guard.handoff.redaction import MASK, normalise, redact, redact_guard_patterns, redact_with_scanner

CORPUS = json.loads((Path(__file__).parents[1] / "fixtures" / "secrets_corpus.json").read_text(encoding="utf-8"))
SECRETS: list[dict[str, str]] = CORPUS["secrets"]
CONTROLS: list[str] = CORPUS["controls"]
IDS = [e["name"] for e in SECRETS]


def leaked(out: str, secret: str) -> bool:
    """Any 8 characters in a row of the secret (all of a short one) still readable."""
    out = normalise(out)
    if secret in out:
        return True
    return len(secret) >= 12 and any(secret[i:i + 8] in out for i in range(len(secret) - 7))


def test_the_corpus_covers_at_least_fifty_forms_and_the_ones_reported() -> None:
    assert len(SECRETS) >= 50 and len(set(IDS)) == len(IDS)
    reported = ["aws secret key in prose", "MYSQL_ROOT_PASS env", "REDIS_PW env", "JSON pass", "slack webhook url",
                "discord webhook url", "azure storage connection string", "curl -u user:pass", "mysql -p attached",
                "sshpass -p", "Cookie sessionid", ".pgpass line", "twilio auth token",
                "sk-proj key with zero-width space", "AKIA id"]
    assert set(reported) <= set(IDS)
    assert any("\u200b" in e["text"] for e in SECRETS)


@pytest.mark.parametrize("entry", SECRETS, ids=IDS)
def test_every_pass_chain_redacts_every_form(entry: dict[str, str]) -> None:
    for out in (redact(entry["text"]), redact_guard_patterns(entry["text"])):
        assert not leaked(out, entry["secret"]), out
        assert MASK in out


@pytest.mark.parametrize("text", CONTROLS)
def test_ordinary_text_is_preserved(text: str) -> None:
    assert redact(text) == text
    assert redact_guard_patterns(text) == text


def test_zero_width_characters_do_not_split_a_key() -> None:
    key = "sk-proj-Ab3De\u200bF6gH9jK2mN5pQ8rS1tV4wX7yZ0"
    assert redact(f"key {key} here") == f"key {MASK} here"


def test_detect_secrets_is_in_the_chain() -> None:
    """A Mailchimp key is left to the maintained scanner: the guard has no rule for it."""
    mailchimp = "mailchimp 0123456789abcdef0123456789abcdef-us12 ok"
    assert redaction.scanner_available()
    assert "0123456789abcdef0123456789abcdef" in redact_guard_patterns(mailchimp)
    assert "0123456789abcdef0123456789abcdef" not in redact_with_scanner(mailchimp)
    assert "0123456789abcdef0123456789abcdef" not in redact(mailchimp)


def test_without_detect_secrets_the_guards_rules_still_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(redaction._scanner_state, "scan", None)
    for entry in SECRETS:
        assert not leaked(redact(entry["text"]), entry["secret"]), entry["name"]


def test_a_failing_host_redactor_keeps_the_guards_work() -> None:
    def broken(text: str) -> str:
        raise RuntimeError("host redactor broke")

    for entry in SECRETS[:5]:
        assert not leaked(redact(entry["text"], broken), entry["secret"])


def _packet(**fields: Any) -> str:
    return render_packet(PacketInputs(session_id="S1", created_at=0.0, **fields))


@pytest.mark.parametrize("entry", SECRETS, ids=IDS)
def test_every_form_is_redacted_in_every_packet_field(entry: dict[str, str]) -> None:
    text = entry["text"]
    packet = _packet(note=text, last_user_request=text, summary=f"## Goal\n{text}", open_questions=[f"{text}?"],
                     todos=[{"id": "1", "content": text, "status": "pending"}], title=text)
    assert not leaked(packet, entry["secret"]), packet


def test_redaction_runs_before_clipping() -> None:
    """A key straddling the note's length limit: clipped after redaction, none of it is left."""
    key = "AKIAZ5KQ3M7N2P4R6T8V"
    for limit, field in ((MAX_NOTE_CHARS, "note"), (MAX_REQUEST_CHARS, "last_user_request")):
        text = "x" * (limit - 14) + " " + key + " tail"
        packet = _packet(**{field: text})
        assert not any(key[i:i + 4] in packet for i in range(4, len(key) - 3)), field
    question = f"is {key} still valid " + "and so on " * 40 + "?"
    assert key[4:12] not in _packet(open_questions=[question])


@pytest.mark.parametrize("entry", SECRETS, ids=IDS)
def test_every_form_is_redacted_in_audit_events(tmp_path: Path, entry: dict[str, str]) -> None:
    path = tmp_path / "audit.jsonl"
    AuditLog(path).operation("S1").warning("handoff.failed", reason=f"ValueError: {entry['text']}",
                                           detail={"nested": [entry["text"]]})
    raw = path.read_text(encoding="utf-8")
    assert not leaked(json.loads(raw)["reason"], entry["secret"])
    assert not leaked(raw.encode().decode("unicode_escape", errors="ignore"), entry["secret"])
    assert read_events(path)[0]["session_id"] == "S1"
