"""Secret redaction for text that leaves the conversation (hand-off packets).

Two passes: the guard's own patterns (API keys, tokens, ``Bearer`` headers,
passwords, URLs carrying credentials, AWS keys, private keys, JWTs), which
replace the whole secret with ``[REDACTED]``, then the host's own redaction
(``agent.redact.redact_sensitive_text`` with ``force=True``) as a second net
for the provider-specific formats Hermes knows about. The guard's pass runs
first and removes the secret entirely; the host's mask would keep a
recognisable head and tail.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MASK = "[REDACTED]"

# Known key / token shapes: the whole match is the secret.
_TOKEN_PATTERNS = [
    r"sk-(?:ant-|proj-|or-)?[A-Za-z0-9_\-]{12,}",  # OpenAI / Anthropic / OpenRouter
    r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_\-]{16,}",  # GitLab
    r"xox[abeoprs]-[A-Za-z0-9\-]{10,}",  # Slack
    r"xapp-\d+-[A-Za-z0-9\-]{10,}",
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API key
    r"ya29\.[0-9A-Za-z_\-]{20,}",  # Google OAuth access token
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}",  # AWS access key id
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"npm_[A-Za-z0-9]{30,}",
    r"pypi-[A-Za-z0-9_\-]{30,}",
    r"(?:gsk|xai|tvly|pplx|fw)[_-][A-Za-z0-9]{20,}",
    r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",  # SendGrid
    r"\b\d{8,10}:[A-Za-z0-9_\-]{35}\b",  # Telegram bot token
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
]

_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
_TOKENS = re.compile("|".join(f"(?:{p})" for p in _TOKEN_PATTERNS))
# Authorization headers and bare bearer credentials.
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)(?:(bearer|basic|token|digest)\s+)?[^\s,;]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
# scheme://user:password@host  and  scheme://token@host
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@:]+(?::[^/\s@]*)?@")
# ?access_token=...&sig=...
_URL_SECRET_PARAM = re.compile(
    r"(?i)([?&#](?:access_token|refresh_token|id_token|token|api_?key|key|secret|client_secret|password|passwd|pwd"
    r"|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|auth|code)=)[^&#\s]+"
)
_SECRET_WORD = (
    r"[A-Za-z0-9_.\-]*(?:password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|client[_\-]?secret|credential|auth[_\-]?key|session[_\-]?key)[A-Za-z0-9_.\-]*"
)
# KEY=value, key: value, "key": "value" (a quoted value may hold spaces; a bare one
# runs up to whitespace, a quote, a comma or a bracket)
_ASSIGNMENT = re.compile(
    r"(?i)(?P<key>[\"']?\b" + _SECRET_WORD + r"[\"']?\s*(?:=|:)\s*)"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"'\n]{1,256})(?P=q)|(?P<value>[^\s\"',;}{\]]{3,}))"
)
# "my password is hunter2"
_PROSE_PASSWORD = re.compile(r"(?i)\b((?:password|passphrase|passwd|pin)\s+(?:is|was|=)\s+)([^\s,;]{3,})")
# aws_secret_access_key-like 40-char values next to an AWS word
_AWS_SECRET = re.compile(r"(?i)(aws[A-Za-z0-9_\-]*\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}")


_COUNT = re.compile(r"[~\d.,_kKmM]+")


def _redact_assignment(m: re.Match[str]) -> str:
    quote = m.group("q") or ""
    value = m.group("quoted") if quote else m.group("value")
    if value.startswith("[REDACTED") or value == "***":
        return m.group(0)
    if "tokens" in m.group("key").lower() and _COUNT.fullmatch(value):
        return m.group(0)  # a token count ("prompt_tokens=41,442"), not a credential
    return f"{m.group('key')}{quote}{MASK}{quote}"


def redact_guard_patterns(text: str) -> str:
    """The guard's own pass: every match is replaced by ``[REDACTED]``."""
    if not text:
        return text
    text = _PRIVATE_KEY.sub(MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _URL_SECRET_PARAM.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{(m.group(2) + ' ') if m.group(2) else ''}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _AWS_SECRET.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _TOKENS.sub(MASK, text)
    text = _ASSIGNMENT.sub(_redact_assignment, text)
    text = _PROSE_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return text


def redact(text: str, host_redactor: Callable[[str], str] | None = None) -> str:
    """Both passes. ``host_redactor`` is the host's function (``None``: guard patterns only).
    A failing host redactor never lets text through unredacted by the guard."""
    text = redact_guard_patterns(text)
    if host_redactor is not None:
        try:
            text = host_redactor(text)
        except Exception:
            pass
    return text
