"""The secret mask below every part: what the audit log, the compaction events and the
dashboard's opened compaction use, with no import of the hand-off extension.

It owns the part of the guard's secret rules every redaction shares: the mask
(``[REDACTED]``), the normalisation (zero-width characters and soft hyphens removed),
private key blocks, the known key and token shapes, and Hermes's own pass under its
bounds (:func:`host_pass`). :func:`mask_secrets` is the guard's pattern pass: the one the
composition root (the package's ``__init__.py``) binds, the hand-off extension's full
pass (``handoff.redaction.redact_guard_patterns``, built on these pieces), or, where
nothing is bound, this module's own (private keys and token shapes). Every rule runs in
time linear in the text (docs/redaction.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from .fail_open import failing_open

MASK = "[REDACTED]"

# Invisible characters people (or a paste) leave inside a token.
_INVISIBLE = re.compile("[\u00ad\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff]")


def normalise(text: str) -> str:
    """``text`` without zero-width characters and soft hyphens."""
    return _INVISIBLE.sub("", text) if text else text


# Known key / token shapes: the whole match is the secret.
TOKEN_PATTERNS = [
    r"sk-(?:ant-|proj-|or-|svcacct-|admin-)?[A-Za-z0-9_\-]{12,}",  # OpenAI / Anthropic / OpenRouter
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
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+",  # Slack webhook
    r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+",  # Discord webhook
    r"ntn_[A-Za-z0-9]{40,}",  # Notion integration token
    r"secret_[A-Za-z0-9]{40,}",  # Notion internal integration secret (the older form)
    r"access_token\$(?:production|sandbox|development|qa)\$[a-z0-9]{16}\$[a-f0-9]{32}",  # Braintree
]

PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
TOKENS = re.compile("|".join(f"(?:{p})" for p in TOKEN_PATTERNS))
# The literal starts of TOKEN_PATTERNS, lower case (the pattern runs only near them)
TOKEN_TRIGGERS = ("sk-", "sk_", "rk_", "pk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox",
                  "xapp-", "aiza", "ya29.", "akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa", "abia",
                  "acca", "hf_", "npm_", "pypi-", "gsk", "xai", "tvly", "pplx", "fw_", "fw-", "sg.", "eyj",
                  "https://", "ntn_", "secret_", "access_token$")


def own_pass(text: str) -> str:
    """This module's own pattern pass (on normalised text): private key blocks and the
    known token shapes become ``[REDACTED]``."""
    if not text:
        return text
    text = PRIVATE_KEY.sub(MASK, normalise(text))
    lowered = text.lower()
    if any(trigger in lowered for trigger in TOKEN_TRIGGERS):
        text = TOKENS.sub(MASK, text)
    return text


_pattern_pass: Callable[[str], str] = own_pass


def bind(pattern_pass: Callable[[str], str]) -> None:
    """The guard's full pattern pass (the composition root hands in the hand-off
    extension's); :func:`mask_secrets` runs it from then on."""
    global _pattern_pass
    _pattern_pass = pattern_pass


def mask_secrets(text: str) -> str:
    """``text`` with what the guard's secret rules find masked: the bound pattern pass,
    or :func:`own_pass` where none is bound."""
    return _pattern_pass(text)


# Hermes's redactor takes time quadratic in a long run of letters and digits (18 s for a
# 120 KB token on 0.19): it sees at most HOST_PASS_MAX_CHARS characters of a text (a
# hand-off packet, whose fields are clipped before, is far shorter), in pieces of at most
# HOST_PASS_MAX_LINE characters.
HOST_PASS_MAX_CHARS = 65_536
HOST_PASS_MAX_LINE = 2_048


def host_pass(text: str, host_redactor: Callable[[str], str] | None) -> str:
    """Hermes's own ``redact_sensitive_text`` last, when there is one, line by line (a
    rule of it that runs over a line end, like its connection-string rule, can never
    delete a line, so never a section of a packet), on at most
    :data:`HOST_PASS_MAX_CHARS` characters in pieces of at most
    :data:`HOST_PASS_MAX_LINE`. Fails open: the guard's passes already ran, so a failing
    host pass is logged and the text kept."""
    if host_redactor is None or not text:
        return text
    with failing_open("Hermes's redaction pass", "the guard's own passes still applied", advice=None,
                      level=logging.WARNING):
        return _by_line(text, host_redactor)
    return text


def _by_line(text: str, host_redactor: Callable[[str], str]) -> str:
    bounded, rest = text[:HOST_PASS_MAX_CHARS], text[HOST_PASS_MAX_CHARS:]
    out = []
    for line in bounded.split("\n"):
        if not line.strip():
            out.append(line)
        elif len(line) <= HOST_PASS_MAX_LINE:
            out.append(host_redactor(line))
        else:
            out.append("".join(host_redactor(line[i:i + HOST_PASS_MAX_LINE])
                               for i in range(0, len(line), HOST_PASS_MAX_LINE)))
    return "\n".join(out) + rest
