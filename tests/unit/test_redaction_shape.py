"""The generic detectors: a value beside a name that says it is a credential, in any
common syntax, and a bare token that looks generated (:mod:`hermes_session_guard.handoff.shape`);
what is recorded as ordinary (hashes, ids, paths, identifiers, data URIs) stays."""

from __future__ import annotations

import random
import string

import pytest

from hermes_session_guard.handoff import shape
from hermes_session_guard.handoff.packet import PacketInputs, render_packet
from hermes_session_guard.handoff.redaction import MASK, masked_values, redact, redact_guard_patterns

# (text, the value that must not stay readable): names and syntaxes no vendor rule knows
BESIDE_A_NAME = [
    ("Ocp-Apim-Subscription-Key: 5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b", "5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b"),
    ("define('LOGGED_IN_SALT', 'q7Rz2mWk9TbX4vLp');", "q7Rz2mWk9TbX4vLp"),
    ("prod signing key -> Hq4mZ8rT2vX6", "Hq4mZ8rT2vX6"),
    ('$config = ["webhook_signature" => "Pz3kW9qL2mX7"];', "Pz3kW9qL2mX7"),
    ("SENTRY_DSN := r8Kq2mZx7TvW", "r8Kq2mZx7TvW"),
    ("the recovery seed is Mq7zX2kW9pLr", "Mq7zX2kW9pLr"),
    ("pgbench -h db -U app -P Wz8qK3mX7rTp", "Wz8qK3mX7rTp"),
    ("backup-tool --creds=Lk9mZ2qX7wRt --verbose", "Lk9mZ2qX7wRt"),
    ("[irc]\noauth_token = 7kq2m9x4p1z8w3r6v5", "7kq2m9x4p1z8w3r6v5"),
]


@pytest.mark.parametrize(("text", "secret"), BESIDE_A_NAME)
def test_a_value_beside_a_secret_name_is_masked_in_any_syntax(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


def _generated(alphabet: str, size: int, seed: int) -> str:
    rng = random.Random(seed)
    while True:
        token = "".join(rng.choice(alphabet) for _ in range(size))
        if any(c.isdigit() for c in token) and any(c.isupper() for c in token) and any(c.islower() for c in token):
            return token


@pytest.mark.parametrize("size", [24, 32, 40])
@pytest.mark.parametrize("alphabet", [string.ascii_letters + string.digits,
                                      string.ascii_letters + string.digits + "-_"])
def test_a_bare_generated_token_is_masked(alphabet: str, size: int) -> None:
    token = _generated(alphabet, size, size)
    out = redact(f"use {token} for the staging deploy")
    assert token not in out and out.startswith("use ") and out.endswith(" for the staging deploy"), out


def test_generated_tokens_of_twelve_to_fifty_characters_are_mostly_masked() -> None:
    """Shape, not a list: random letter-and-digit tokens, most of them taken."""
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits
    tokens = ["".join(rng.choice(alphabet) for _ in range(rng.randint(12, 50))) for _ in range(400)]
    assert sum(shape.looks_generated(t) for t in tokens) >= 0.85 * len(tokens)


ORDINARY = [
    "commit 3f9a1c7e2b4d6f8a0c1e3b5d7f9a1c3e5b7d9f1a and abbrev 3f9a1c7",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "request 550e8400-e29b-41d4-a716-446655440000 and trace 4bf92f3577b34da6a3ce929d0e0e4736",
    "session 20260528_093510_66bfaec7 snapshot 20260528_093510_66bfaec7.snapshot.20260528T161635.123456Z",
    "see /var/lib/hermes/sessions/session_20260528_093510.json and ~/projects/RootManageSharedAccessKey2/README.md",
    "class HTTPServer2Handler(BaseHTTPRequestHandler): getUTF8StringFromBytes, parse_ISO8601_timestamp",
    "models: Qwen2.5-Coder-32B-Instruct, claude-3-5-sonnet-20241022, gpt-4o-mini-2024-07-18, Llama-3.1-70B",
    "pod web-7d4b9c8f6d-x2k9p restarted; container 3f2a9c1b7d4e exited; node-v20.11.1-linux-x64.tar.xz",
    "primary_key: id\ncache_key: user:123\nsort_key=created_at_2024\nprivate: true",
    "docker run -p 8080:80 nginx && ssh -p 2222 host && pip install -k",
    "the keyboard layout, a tokenizer, the passage about monkeys: PBKDF2HMAC with SHA256",
    '<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAC">',
    "the token count was 41442 and the API key name is ProdKey2024Main",
    "version 1.2.3-beta.4+build.20240101, ticket JIRA-1234, ARN arn:aws:iam::123456789012:role/Deploy",
    "strftime %Y%m%d%H%M%S, colour #FFD700/#FFBF00, mail devops.team2024@company.com, 2>&1 && $HOME/.config",
    '<script integrity="sha384-Hn2kIRyYInQwFLKi6mjnAT84Xme0c9mofnKuYR9kBAmoYgPFOeRULUcD7nYNIT/S"></script>',
    "golang.org/x/text v0.14.0 h1:Eglw2BKDbxmIhiVYekYGpa0jzvMchoTmAXcVUlSPxrk=",
    "https://img.shields.io/pypi/v/x?color=%2334D058&label=pypi%20package",
]


def test_a_password_with_symbols_is_one_token() -> None:
    assert redact("the vpn: use Tr0ub4dor#3xQ9z today") == f"the vpn: use {MASK} today"


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_ids_hashes_paths_and_identifiers_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("next_line", ["release2024", "PORT=8080", "v2.4.1", "DEBUG_MODE"])
def test_a_shape_masked_value_never_takes_the_next_line(next_line: str) -> None:
    token = _generated(string.ascii_letters + string.digits, 20, 3)
    out = redact_guard_patterns(f"{token}\n{next_line}\nLOG_LEVEL=info")
    assert out == f"{MASK}\n{next_line}\nLOG_LEVEL=info"


def test_a_path_keeps_its_words_and_loses_its_generated_part() -> None:
    token = _generated(string.ascii_letters + string.digits, 24, 5)
    out = redact(f"cat /tmp/upload/{token}/report.txt")
    assert out == f"cat /tmp/upload/{MASK}/report.txt"


def test_a_value_seen_beside_its_name_is_masked_where_it_is_echoed_bare() -> None:
    """A short hex key or a word-and-digit password only context tells: known once seen with it."""
    session = "Ocp-Apim-Subscription-Key: 5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b\nDB_PASSWORD=hunter2hunter2"
    known = masked_values(session)
    assert {"5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b", "hunter2hunter2"} <= known
    packet = render_packet(PacketInputs(session_id="S", created_at=0.0, secret_values=known,
                                        note="retry with 5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b",
                                        last_user_request="is hunter2hunter2 still right?"))
    assert "5e1f0c9ab37d4e2f8a6b0c1d2e3f4a5b" not in packet and "hunter2hunter2" not in packet


def test_a_megabyte_token_is_judged_by_its_start() -> None:
    token = _generated(string.ascii_letters + string.digits, 64, 9) * 16_384
    assert shape.looks_generated(token)
    assert redact(f"x {token} y") == f"x {MASK} y"
