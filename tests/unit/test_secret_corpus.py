"""The secret corpus (tests/fixtures/secrets_corpus.json, one entry per secret form)
through every pass of the guard's redaction, the hand-off packet's fields (redacted
before they are clipped) and audit events; the non-secret controls come out unchanged.

The corpus's held-out sets were written before the rules that catch them and are not
tuned on: ``held_out`` (same kinds, other spellings and contexts), ``held_out_2`` (the
kinds reported missed and others) and ``held_out_3`` (connection strings, flags, config;
the forms each missed when first measured moved to the tuned set), ``held_out_4``
(written before the last tuning round) and ``held_out_5`` (written without sight of the
rules, measured once after the generic detectors were committed). Each is held at its measured
fraction of forms masked in every field of a packet; the 97 % target is not met on a
set's first measurement (docs/redaction.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard.audit import AuditLog, read_events
from hermes_session_guard.handoff import rule_set
from hermes_session_guard.handoff.packet import MAX_NOTE_CHARS, MAX_REQUEST_CHARS, PacketInputs, render_packet
from hermes_session_guard.handoff.redaction import MASK, normalise, redact, redact_guard_patterns

CORPUS = json.loads((Path(__file__).parents[1] / "fixtures" / "secrets_corpus.json").read_text(encoding="utf-8"))
SECRETS: list[dict[str, str]] = CORPUS["secrets"]
CONTROLS: list[str] = CORPUS["controls"]
HELD_OUT: list[dict[str, str]] = CORPUS["held_out"]
# (set, the fraction that must be masked in every packet field). held_out (32 of 33, 96.97 %)
# and held_out_4 (13 of 30) were held at what they measured, held_out_2 and held_out_3 at 97 %
# after the forms they missed when first measured (8 of 47, 9 of 33) moved to the tuned set.
# The generic detectors (a value beside a secret name, a bare generated-looking token) mask
# all four sets whole; they were written with these sets in view, so each is held at the
# 97 % target, and only a set measured once after them tells how they generalise:
# held_out_5 (45 forms written without sight of the rules, first measured after the
# detectors were committed: 44 of 45, 97.8 %); the one it missed (a Twitch ``oauth =
# oauth:…`` value, small letters and digits) then moved to the tuned set when the
# detectors were fixed for it, 44 of 44 of the rest.
HELD_OUT_SETS = {"held_out": 0.97, "held_out_2": 0.97, "held_out_3": 0.97, "held_out_4": 0.97,
                 "held_out_5": 0.97}
IDS = [e["name"] for e in SECRETS]
# Provider token forms only the shipped rule sets know: hex after a prefix, which neither the
# guard's own rules nor its shape detector take for a secret (age, Heroku, Terraform Cloud,
# New Relic, Google, Atlassian, Grafana and Databricks tokens, also provider-only before the
# shape detector, look generated and are masked without the rule sets; a Shopify token after
# the word "token" is a value beside a secret name)
PROVIDER_ONLY = {"mailgun key", "postman api key", "supabase access token", "pulumi access token"}


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


def test_the_corpus_covers_the_kinds_of_issue_27_and_keeps_a_held_out_set() -> None:
    kinds = ["vault hvs token env", "age secret key", "putty private key body", "openssh key body without header",
             "kubeconfig client-key-data", ".netrc password", "docker config auth", "shopify admin token",
             "shopify shared secret", "sentry user token", "mailgun key", "heroku HRKU token", "terraform cloud token",
             "new relic user key", "datadog api key in prose", "google oauth client secret", "atlassian api token",
             "linear api key", "postman api key", "grafana service account token", "databricks token",
             "doppler service token", "supabase access token", "pulumi access token", "teams webhook",
             "sas signature after a space", "api key split over two lines", "folded yaml password",
             "full-width colon password"]
    assert set(kinds) <= set(IDS)
    assert len(HELD_OUT) >= 30
    for name in HELD_OUT_SETS:
        assert len(CORPUS[name]) >= 20
        assert not {e["name"] for e in CORPUS[name]} & set(IDS)
        assert not {e["secret"] for e in CORPUS[name]} & {e["secret"] for e in SECRETS}


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


def test_detect_secrets_patterns_are_in_the_rule_set() -> None:
    """A Mailchimp key is left to detect-secrets' plugin: the guard has no rule of its own for it."""
    mailchimp = "mailchimp 0123456789abcdef0123456789abcdef-us12 ok"
    rules = rule_set.rule_set()
    assert rules is not None and rules.stats["detect_secrets_plugins"] >= 15
    assert "0123456789abcdef0123456789abcdef" in redact_guard_patterns(mailchimp, with_rule_sets=False)
    assert "0123456789abcdef0123456789abcdef" not in rule_set.redact_with_rules(mailchimp, MASK)
    assert "0123456789abcdef0123456789abcdef" not in redact(mailchimp)


def test_without_the_rule_sets_the_guards_rules_still_apply(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Rule data that cannot be loaded: logged once, the guard's own rules still mask every
    form but the provider tokens only the rule sets know."""
    monkeypatch.setattr(rule_set, "_state", {})
    monkeypatch.setattr(rule_set, "_load_data", lambda: (_ for _ in ()).throw(OSError("gone")))
    with caplog.at_level("WARNING", logger="hermes_session_guard"):
        assert rule_set.rule_set() is None
        leaked_names = {e["name"] for e in SECRETS if leaked(redact(e["text"]), e["secret"])}
    assert leaked_names == PROVIDER_ONLY
    assert sum("provider rule set could not be loaded" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("entry", SECRETS, ids=IDS)
def test_provider_forms_need_the_rule_sets(entry: dict[str, str]) -> None:
    """The rule sets do the work for the provider forms (and the guard's rules for the rest)."""
    alone = redact_guard_patterns(entry["text"], with_rule_sets=False)
    assert leaked(alone, entry["secret"]) == (entry["name"] in PROVIDER_ONLY)


PACKET_FIELDS = {
    "note": lambda t: {"note": t},
    "last user request": lambda t: {"last_user_request": t},
    "latest summary": lambda t: {"summary": f"## Goal\n{t}"},
    "compacted turns": lambda t: {"summary": f"## Relevant Files\n- {t}"},
    "open question": lambda t: {"open_questions": [f"{t}?"]},
    "todo": lambda t: {"todos": [{"id": "1", "content": t, "status": "pending"}]},
    "title": lambda t: {"title": t},
}


def _masked_in_every_field(entries: list[dict[str, str]]) -> tuple[float, list[tuple[str, list[str]]]]:
    missed = []
    for entry in entries:
        fields = [name for name, make in PACKET_FIELDS.items()
                  if leaked(_packet(**make(entry["text"])), entry["secret"])]
        if fields:
            missed.append((entry["name"], fields))
    return 1 - len(missed) / len(entries), missed


def test_tuned_forms_are_masked_in_every_packet_field() -> None:
    fraction, missed = _masked_in_every_field(SECRETS)
    print(f"tuned forms masked in every field: {fraction:.1%}; missed: {missed}")
    assert fraction >= 0.97 and not missed, missed


@pytest.mark.parametrize("name", HELD_OUT_SETS)
def test_held_out_forms_are_masked_in_every_packet_field(name: str) -> None:
    fraction, missed = _masked_in_every_field(CORPUS[name])
    print(f"{name}: masked in every field {fraction:.1%} of {len(CORPUS[name])}; missed: {missed}")
    assert fraction >= HELD_OUT_SETS[name], missed


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
