"""The guard's own secret patterns (the host's redaction is exercised by the host tests)."""

from __future__ import annotations

import pytest

from hermes_session_guard.handoff.redaction import MASK, redact, redact_guard_patterns

PLANTED = [
    ("openai key", "use sk-proj-Abc123Def456Ghi789Jkl0 now", "Abc123Def456Ghi789Jkl0"),
    ("anthropic key", "ANTHROPIC=sk-ant-api03-AAAABBBBCCCCDDDDEEEE", "AAAABBBBCCCCDDDDEEEE"),
    ("github token", "token ghp_0123456789abcdefABCDEF0123456789abcd", "0123456789abcdefABCDEF"),
    ("slack token", "xoxb-123456789012-abcdefABCDEF", "abcdefABCDEF"),
    ("aws access key id", "key AKIAIOSFODNN7EXAMPLE in use", "IOSFODNN7EXAMPLE"),
    ("aws secret", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("bearer header", "Authorization: Bearer abcDEF123456ghiJKL", "abcDEF123456ghiJKL"),
    ("bare bearer", "curl -H 'bearer abcDEF123456ghiJKL789'", "abcDEF123456ghiJKL789"),
    ("basic header", "authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    ("password assignment", "DB_PASSWORD=hunter2hunter2", "hunter2hunter2"),
    ("json password", '{"password": "correct horse"}', "correct horse"),
    ("yaml api key", "api_key: 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("prose password", "my password is Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("url credentials", "clone https://bob:s3cr3tPa55@git.example.com/r.git", "s3cr3tPa55"),
    ("url token userinfo", "https://ghtoken123456@github.com/x", "ghtoken123456"),
    ("db url", "postgres://app:Sup3rPass@db.internal:5432/app", "Sup3rPass"),
    ("url query token", "https://x.io/cb?code=abc123XYZ&access_token=tok987654321", "tok987654321"),
    ("private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
     "MIIEpAIBAAKCAQEA"),
    ("jwt", "id eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM", "SflKxwRJSMeKKF2QT4fwpM"),
    ("telegram bot token", "bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1 ok",
     "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1"),
    ("google key", "AIzaSyA1234567890abcdefghijklmnopqrstu", "SyA1234567890abcdefg"),
]


@pytest.mark.parametrize(("kind", "text", "secret"), PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_secret_does_not_survive(kind: str, text: str, secret: str) -> None:
    out = redact_guard_patterns(text)
    assert secret not in out, out
    assert MASK in out


@pytest.mark.parametrize(
    "text",
    [
        "session 20260528_093510_66bfaec7 has snapshot 20260528_093510_66bfaec7.snapshot.20260528T161635.123456Z",
        "compressed 194->26 messages, prompt_tokens=41,442 tokens=~145,948",
        "see /root/.hermes/handoffs/x.handoff.20260101T000000Z.md and https://example.com/docs?page=2",
        "We discussed the token budget and the password policy.",
        "## Pending User Asks\n- Should we rotate the key?",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_guard_patterns(text) == text


def test_host_pass_runs_after_the_guard_and_cannot_unredact() -> None:
    seen: list[str] = []

    def host(text: str) -> str:
        seen.append(text)
        return text.replace("exa_hostonly", "exa_***")

    assert redact("k=sk-proj-Abc123Def456Ghi789 and exa_hostonly", host) == "k=[REDACTED] and exa_***"
    assert seen == ["k=[REDACTED] and exa_hostonly"]


def test_a_failing_host_redactor_keeps_the_guard_pass() -> None:
    def broken(text: str) -> str:
        raise RuntimeError("boom")

    assert redact("passwd: hunter2hunter2", broken) == "passwd: [REDACTED]"


def test_a_failing_host_pass_keeps_the_guards_redaction_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_text: str) -> str:
        raise ValueError("host redactor broke")

    with caplog.at_level("WARNING", logger="hermes_session_guard"):
        out = redact("password=hunter2hunter2 and more", broken)
    assert "hunter2hunter2" not in out and MASK in out
    assert any("Hermes's redaction pass failed" in r.getMessage() and "ValueError" in r.getMessage()
               for r in caplog.records)
