"""Secret redaction for text that leaves the conversation (hand-off packets, notes)
and a last net for the audit log.

The text is first normalised (zero-width characters and soft hyphens removed, so a
key with an invisible character inside is still one key), then three passes run,
each replacing what it finds with ``[REDACTED]``:

1. the guard's targeted rules (:func:`redact_guard_patterns`): the forms the two
   scanners below do not catch or only half-mask (``MYSQL_ROOT_PASS=``, ``REDIS_PW=``,
   JSON ``"pass"``, Slack and Discord webhook URLs, Azure ``AccountKey=``, ``curl -u``,
   ``mysql -p``, ``sshpass -p``, cookies, ``.pgpass`` lines, Twilio tokens, AWS secret
   keys in prose, provider API keys, URL credentials, private keys, JWTs, ...);
2. ``detect-secrets`` (Yelp's maintained scanner), line by line with its
   pattern plugins (AWS, Azure, Slack, Discord, Twilio, Stripe, GitHub, GitLab, npm,
   PyPI, SendGrid, Telegram, OpenAI, Mailchimp, Artifactory, IBM, Square, JWT,
   private keys, basic-auth URLs, secret keywords); its entropy and IP plugins are
   off: they flag ordinary words, session ids and commit hashes;
3. Hermes's own ``redact_sensitive_text`` (forced on), where the installed release
   has it, as a net for the provider formats Hermes knows.

A pass that fails (detect-secrets not installed, an error in the host's function)
is skipped with the others still applied; the guard's own pass always runs.
Callers redact each piece of text before clipping it, so a clipped secret is never
left half-visible.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hermes_session_guard")

MASK = "[REDACTED]"

# Invisible characters people (or a paste) leave inside a token.
_INVISIBLE = re.compile("[\u00ad\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff]")


def normalise(text: str) -> str:
    """``text`` without zero-width characters and soft hyphens."""
    return _INVISIBLE.sub("", text) if text else text


# Known key / token shapes: the whole match is the secret.
_TOKEN_PATTERNS = [
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
    r"\b\d{8,10}:[A-Za-z0-9_\-]{35}\b",  # Telegram bot token
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
    r"\b(?:SK|AC)[0-9a-fA-F]{32}\b",  # Twilio API key / account SIDs
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+",  # Slack webhook
    r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+",  # Discord webhook
]

_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
_TOKENS = re.compile("|".join(f"(?:{p})" for p in _TOKEN_PATTERNS))
# Authorization headers and bare bearer credentials.
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)(?:(bearer|basic|token|digest)\s+)?[^\s,;]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
# X-Api-Key: ..., X-Auth-Token: ...
_KEY_HEADER = re.compile(r"(?im)^(\s*x-[a-z\-]*(?:key|token|secret|auth)[a-z\-]*\s*:\s*)\S+")
# scheme://user:password@host  and  scheme://token@host  and  scheme://:password@host
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@:]*(?::[^/\s@]*)?@")
# ?access_token=...&sig=...
_URL_SECRET_PARAM = re.compile(
    r"(?i)([?&#;](?:access_token|refresh_token|id_token|token|api_?key|key|secret|client_secret|password|passwd|pwd"
    r"|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|auth|code)=)[^&#\s;]+"
)
# Azure connection strings: AccountKey=...; SharedAccessKey=...; SharedAccessSignature=...
_AZURE = re.compile(r"(?i)\b((?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*)[^;\s\"']+")
_SECRET_WORD = (
    r"[A-Za-z0-9_.\-]*(?:password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|client[_\-]?secret|credential|auth[_\-]?key|session[_\-]?key|sessionid|session_id"
    r"|(?<![A-Za-z])(?:pass|pw|pword)(?![A-Za-z]))[A-Za-z0-9_.\-]*"
)
# KEY=value, key: value, "key": "value" (a quoted value may hold spaces; a bare one
# runs up to whitespace, a quote, a comma or a bracket)
_ASSIGNMENT = re.compile(
    r"(?i)(?P<key>[\"']?\b" + _SECRET_WORD + r"[\"']?\s*(?:=|:)\s*)"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"'\n]{1,256})(?P=q)|(?P<value>[^\s\"',;}{\]]{3,}))"
)
# "my password is hunter2", "the password for the vpn is X"
_PROSE_PASSWORD = re.compile(
    r"(?i)\b((?:password|passphrase|passwd|pin|secret(?: key)?|api key|token)\b[^.\n:=]{0,40}?\s(?:is|was|=)\s+)"
    r"([^\s,;]{3,})"
)
# aws_secret_access_key-like 40-char values next to an AWS word
_AWS_SECRET = re.compile(r"(?i)(aws[A-Za-z0-9_\-]*\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}")
# A free-standing 40-character AWS-secret-shaped token (mixed case and a digit or a
# slash/plus): a secret key pasted into prose. A 40-hex git hash is one case only.
_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])"
                               r"(?=[A-Za-z0-9/+]*[0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
# curl -u user:pass / --user user:pass / --user=user:pass
_CURL_USER = re.compile(r"(?i)(\bcurl\b[^\n]*?\s(?:-u|--user)(?:\s+|=)[\"']?[^\s:\"']+:)([^\s\"']+)")
# mysql -pSECRET / --password=SECRET (a bare -p prompts: nothing to hide)
_MYSQL_P = re.compile(r"(?i)(\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\b[^\n]*?\s(?:-p|--password=))"
                      r"([^\s\"'`]+|\"[^\"\n]*\"|'[^'\n]*')")
# sshpass -p SECRET, docker login -p SECRET, --password SECRET
_DASH_P = re.compile(r"(?i)(\b(?:sshpass|docker\s+login|podman\s+login|helm\s+registry\s+login)\b[^\n]*?\s"
                     r"(?:-p|--password)(?:\s+|=))([^\s\"']+|\"[^\"\n]*\"|'[^'\n]*')")
# Cookie: a=b; c=d  and  Set-Cookie: a=b; Path=/
_COOKIE = re.compile(r"(?im)\b((?:set-)?cookie\s*:\s*)([^\n]+)")
_COOKIE_PAIR = re.compile(r"([A-Za-z0-9_.\-]+=)([^;\s]+)")
_COOKIE_ATTRS = {"path=", "domain=", "expires=", "max-age=", "samesite=", "priority="}
# .pgpass: hostname:port:database:username:password
# (a line of its own or the end of one; the host is ``*`` or has a letter or a dot)
_PGPASS = re.compile(r"(?m)((?:^|(?<=\s))(?:\*|[^:\s#]*[A-Za-z.][^:\s#]*):(?:\d+|\*):[^:\s]+:[^:\s]+:)(\S+)"
                     r"(?=[ \t]*$)")
# A Twilio auth token (32 hex) named as such
_TWILIO = re.compile(r"(?i)(\btwilio\b[^\n]{0,40}?)\b[0-9a-f]{32}\b")


# The rest of a token an earlier mask only half covered (a zero-width character split
# the key when another redactor ran, so it masked the head): mask glued to 8+ token
# characters with a digit among them.
_MASK_REMAINDER = re.compile(r"(?:\*{3}|\[REDACTED\])(?=[A-Za-z0-9_/+=\-]*\d)[A-Za-z0-9_/+=\-]{8,}")

_COUNT = re.compile(r"[~\d.,_kKmM]+")


def _redact_assignment(m: re.Match[str]) -> str:
    quote = m.group("q") or ""
    value = m.group("quoted") if quote else m.group("value")
    if value.startswith("[REDACTED") or value == "***":
        return m.group(0)
    if "tokens" in m.group("key").lower() and _COUNT.fullmatch(value):
        return m.group(0)  # a token count ("prompt_tokens=41,442"), not a credential
    return f"{m.group('key')}{quote}{MASK}{quote}"


def _redact_cookie(m: re.Match[str]) -> str:
    def pair(p: re.Match[str]) -> str:
        return p.group(0) if p.group(1).lower() in _COOKIE_ATTRS else f"{p.group(1)}{MASK}"

    return m.group(1) + _COOKIE_PAIR.sub(pair, m.group(2))


def _keep_head(m: re.Match[str]) -> str:
    return f"{m.group(1)}{MASK}"


def redact_guard_patterns(text: str) -> str:
    """The guard's own pass (on normalised text): every match becomes ``[REDACTED]``."""
    if not text:
        return text
    text = normalise(text)
    text = _PRIVATE_KEY.sub(MASK, text)
    text = _TOKENS.sub(MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _URL_SECRET_PARAM.sub(_keep_head, text)
    text = _AZURE.sub(_keep_head, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{(m.group(2) + ' ') if m.group(2) else ''}{MASK}", text)
    text = _BEARER.sub(_keep_head, text)
    text = _KEY_HEADER.sub(_keep_head, text)
    text = _COOKIE.sub(_redact_cookie, text)
    text = _CURL_USER.sub(_keep_head, text)
    text = _MYSQL_P.sub(_keep_head, text)
    text = _DASH_P.sub(_keep_head, text)
    text = _PGPASS.sub(_keep_head, text)
    text = _TWILIO.sub(_keep_head, text)
    text = _AWS_SECRET.sub(_keep_head, text)
    text = _AWS_SECRET_SHAPE.sub(MASK, text)
    text = _ASSIGNMENT.sub(_redact_assignment, text)
    text = _PROSE_PASSWORD.sub(lambda m: m.group(1) + (m.group(2) if m.group(2).startswith("[REDACTED") else MASK),
                               text)
    text = _MASK_REMAINDER.sub(MASK, text)
    return text


# -- detect-secrets ------------------------------------------------------------------------

# Plugins that flag ordinary words, ids and hashes in prose, or things that are not secrets.
_SCANNER_EXCLUDED = {"Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector"}
_MIN_SCANNED_SECRET = 4
_scanner_state: dict[str, Any] = {}
_scanner_lock = threading.Lock()


def _scanner() -> Callable[[list[str]], list[list[str]]] | None:
    """A function returning the secret values detect-secrets finds in each of some
    lines, or ``None`` when it is not installed or fails to start (said once)."""
    with _scanner_lock:
        if "scan" in _scanner_state:
            return _scanner_state["scan"]  # type: ignore[no-any-return]
        try:
            from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
            from detect_secrets.core.scan import scan_line
            from detect_secrets.settings import transient_settings

            names = sorted(
                cls.__name__ for cls in get_mapping_from_secret_type_to_class().values()
                if cls.__name__ not in _SCANNER_EXCLUDED
            )
            settings = {"plugins_used": [{"name": n} for n in names]}

            def scan(lines: list[str]) -> list[list[str]]:
                with transient_settings(settings):  # once per text: setting the plugins up is the costly part
                    return [[s.secret_value for s in scan_line(line) if s.secret_value] if line.strip() else []
                            for line in lines]

            scan(["warm-up"])
        except Exception as exc:
            log.warning("session guard: detect-secrets is unavailable (%s: %s); hand-off packets are redacted by "
                        "the guard's rules and Hermes's redactor only. `pip install detect-secrets`.",
                        type(exc).__name__, exc)
            _scanner_state["scan"] = None
            return None
        _scanner_state["scan"] = scan
        return scan


def scanner_available() -> bool:
    return _scanner() is not None


def redact_with_scanner(text: str) -> str:
    """detect-secrets' pass: each secret value it reports on a line is masked there."""
    scan = _scanner()
    if scan is None or not text:
        return text
    lines = text.split("\n")
    found_per_line = scan(lines)
    out = []
    for line, found in zip(lines, found_per_line, strict=True):
        for value in sorted(set(found), key=len, reverse=True):
            if len(value) >= _MIN_SCANNED_SECRET and "[REDACTED]" not in value:
                line = line.replace(value, MASK)
        out.append(line)
    return "\n".join(out)


def redact(text: str, host_redactor: Callable[[str], str] | None = None) -> str:
    """All passes: normalise, the guard's rules, detect-secrets, then the host's
    function (``None``: skipped). A failing pass never undoes the ones before it."""
    if not text:
        return text
    text = redact_guard_patterns(text)
    try:
        text = redact_with_scanner(text)
    except Exception as exc:
        log.warning("session guard: detect-secrets pass failed (%s: %s); the guard's own pass still applied",
                    type(exc).__name__, exc)
    return host_pass(text, host_redactor)


def host_pass(text: str, host_redactor: Callable[[str], str] | None) -> str:
    """Hermes's own ``redact_sensitive_text`` last, when there is one. Fails open: the
    guard's passes already ran, so a failing host pass is logged and the text kept."""
    if host_redactor is None:
        return text
    try:
        return host_redactor(text)
    except Exception as exc:
        log.warning("session guard: Hermes's redaction pass failed (%s: %s); the guard's own passes still applied",
                    type(exc).__name__, exc)
        return text
