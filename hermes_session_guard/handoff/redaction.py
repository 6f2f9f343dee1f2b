"""Secret redaction for text that leaves the conversation (hand-off packets, notes)
and a last net for the audit log.

The text is first normalised (zero-width characters and soft hyphens removed, so a
key with an invisible character inside is still one key), then each pass replaces
what it finds with ``[REDACTED]``:

1. private key blocks;
2. the shipped provider rule sets (:mod:`.rule_set`: CredSweeper's rules, kept as
   package data, and detect-secrets' pattern plugins);
3. the guard's own rules (:data:`_GUARD_RULES`): agent-world provider keys, URL
   credentials, headers, cookies, command-line passwords, ``.pgpass`` and ``.netrc``
   lines, Docker ``"auth"``, webhook URLs, PuTTY and header-less key bodies, YAML
   block scalars, assignments (full-width separators too) and prose, the rest of a
   value split over two lines; then the generic detectors (ADR 0031): a value beside a
   secret-ish name in any common syntax, and a bare token that looks generated
   (:mod:`.shape`);
4. values masked with their context elsewhere (:func:`masked_values`), wherever they
   are echoed bare (:func:`mask_known`);
5. Hermes's own ``redact_sensitive_text`` (forced on), where the installed release
   has it, as a net for the provider formats Hermes knows (:func:`host_pass`: line by
   line, on bounded pieces, so it can neither delete a section nor take quadratic time).

Passes 1-3 are :func:`redact_guard_patterns` (the audit log's net too). A pass that
fails is logged and skipped with the others still applied. Every rule runs in time
linear in the text: see :mod:`.rule_set` and docs/redaction.md. Callers redact each
piece of text before clipping it, so a clipped secret is never left half-visible.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from ..fail_open import failing_open

# The shared part lives below every part: the audit log's mask uses it too (re-exported here)
from ..redaction_core import HOST_PASS_MAX_CHARS as HOST_PASS_MAX_CHARS
from ..redaction_core import HOST_PASS_MAX_LINE as HOST_PASS_MAX_LINE
from ..redaction_core import MASK as MASK
from ..redaction_core import PRIVATE_KEY as _PRIVATE_KEY
from ..redaction_core import TOKEN_TRIGGERS as _TOKEN_TRIGGERS
from ..redaction_core import TOKENS as _TOKENS
from ..redaction_core import host_pass as host_pass
from ..redaction_core import normalise as normalise
from . import rule_set, shape

_TELEGRAM = re.compile(r"\b\d{8,10}:[A-Za-z0-9_\-]{35}\b")  # Telegram bot token
_TELEGRAM_SECRET = re.compile(r":[A-Za-z0-9_\-]{35}")  # its secret half, found from the literal ":"
_TWILIO_SID = re.compile(r"\b(?:SK|AC)[0-9a-fA-F]{32}\b")  # Twilio API key / account SIDs
# The auth token passed right after the SID: Client('AC...', '<token>')
_TWILIO_PAIR = re.compile(r"(\b(?:SK|AC)[0-9a-fA-F]{32}[\"'`]?[ \t]{0,8},[ \t]{0,8}[\"'`]?)[0-9a-fA-F]{32}\b")
# Authorization headers and bare bearer credentials.
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization[ \t]*[:=][ \t]*)"
                          r"(?:([A-Za-z][A-Za-z0-9_\-]{1,20})[ \t]+(?=[^\s,;]))?[^\s,;]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
# X-Api-Key: ..., X-Auth-Token: ...
_KEY_HEADER = re.compile(r"(?im)^([ \t]{0,16}x-[a-z\-]{0,64}?(?:key|token|secret|auth)[a-z\-]{0,64}[ \t]*:[ \t]*)\S+")
# What a key or header name ends with when its value names or points to a secret instead of
# being one (SharedAccessKeyName, token_uri, secretName, X-Auth-Email, PASSWORD_FILE)
_NOT_SECRET_SUFFIX = re.compile(r"(?i)(?:name|id|ids|type|uri|url|endpoint|path|file|dir|email|user|username|length"
                                r"|size|count|expiry|expires|expires_in|ttl|version|header|prefix|format|policy"
                                r"|method|scheme|label|hint|reset)[\"']?[ \t]*[=:\uff1a\uff1d]?[ \t]*\Z")
# scheme://user:password@host  and  scheme://token@host  and  scheme://:password@host
_URL_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]{0,31}://)[^/\s@:]{0,256}(?::[^/\s@]{0,256})?@")
# ?access_token=...&sig=...
_URL_SECRET_PARAM = re.compile(
    r"(?i)([?&#;](?:access_token|refresh_token|id_token|token|api_?key|key|secret|client_secret|password|passwd|pwd"
    r"|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|auth|code)=)[^&#\s;]+"
)
# Azure connection strings: AccountKey=...; SharedAccessKey=...; SharedAccessSignature=...
_AZURE = re.compile(r"(?i)\b((?:AccountKey|SharedAccessKey|SharedAccessSignature)[ \t]*=[ \t]*)[^;\s\"']+")
_SECRET_KEYWORD = (
    r"(?:password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|client[_\-]?secret|credential|auth[_\-]?key|app[_\-]?key|session[_\-]?key|sessionid"
    r"|session_id|key[_\-]?data|密码|密碼|口令|令牌|密钥|密鑰|秘钥|秘鑰|暗号|パスワード|비밀번호|비번|토큰|пароль|токен"
    r"|(?<![A-Za-z])(?:pass|pw|pword|psk)(?![A-Za-z]))"
)
_SECRET_WORD = r"[A-Za-z0-9_.\-]{0,64}?" + _SECRET_KEYWORD + r"[A-Za-z0-9_.\-]{0,64}"
# KEY=value, key: value, "key": "value" (a quoted value may hold spaces; a bare one
# runs up to whitespace, a quote, a comma or a bracket)
_ASSIGNMENT = re.compile(
    # the key from its secret word on (what comes before the word is kept as it is anyway)
    r"(?i)(?P<key>" + _SECRET_KEYWORD + r"[A-Za-z0-9_.\-]{0,64}[\"']?[ \t]{0,16}[=:\uff1a\uff1d][ \t]{0,16})"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"'\n]{1,256})(?P=q)|(?P<value>[^\s\"',;}{\]]{3,}))"
)
# XML/.config: <add key="DbPassword" value="..."/>, <property name="db.password" value="..."/>
_XML_KEYED_VALUE = re.compile(r"(?i)(\b(?:key|name)[ \t]*=[ \t]*[\"'][^\"'\n<>]{0,64}?" + _SECRET_KEYWORD
                              + r"[^\"'\n<>]{0,64}?[\"'][ \t]+value[ \t]*=[ \t]*([\"']))([^\"'\n]{1,256})(?=\2)")
# <password>...</password>, <entry key="apiSecret">...</entry>
_XML_ELEMENT = re.compile(r"(?i)(<(?:[A-Za-z0-9_.:\-]{0,64}?" + _SECRET_KEYWORD + r"[A-Za-z0-9_.:\-]{0,64}"
                          r"|[A-Za-z0-9_.:\-]{1,64}[ \t]+(?:key|name)[ \t]*=[ \t]*[\"'][^\"'\n<>]{0,64}?"
                          + _SECRET_KEYWORD + r"[^\"'\n<>]{0,64}[\"'])[ \t]*>)([^<\n]{1,256})(?=</)")
# | API key | value | (a Markdown table row)
_TABLE_ROW = re.compile(r"(?im)^([ \t]{0,16}\|[ \t]*[^|\n]{0,64}?(?:(?:api|access|secret) key|" + _SECRET_KEYWORD
                        + r")[^|\n]{0,64}\|[ \t]*)"
                        r"([^|\s][^|\n]{0,255}?)(?=[ \t]*\|)")
# "the password HAC66klP.uvBt5wOaS": a password word, then a value with letters and digits
_PASSWORD_VALUE = re.compile(r"(?i)(\b(?:password|passwd|passphrase|pw)[ \t]+)"
                             r"((?=[^\s,;]{0,255}[0-9])(?=[^\s,;]{0,255}[A-Za-z])[^\s,;]{8,256})")
# An upper-case environment name ending in _KEY (ALGOLIA_ADMIN_KEY=...): a value with letters and digits
_ENV_KEY = re.compile(r"(\b[A-Z][A-Z0-9_]{0,64}_KEY[ \t]*=[ \t]*[\"']?)"
                      r"((?=[A-Za-z0-9_+/.\-]{0,255}[0-9])(?=[A-Za-z0-9_+/.\-]{0,255}[A-Za-z])[A-Za-z0-9_+/.\-]{8,256}={0,2})")
# Command-line password options no ordinary command shares: keytool's store and key passwords
_KEYTOOL_PASS = re.compile(r"(?i)((?<=\s)-(?:src|dest)?(?:store|key)pass(?:[ \t]+|=))"
                           r"([^\s\"']+|\"[^\"\n]*\"|'[^'\n]*')")
# ldapsearch/ldapmodify/... -w PASSWORD (after an ldap command on its line)
_LDAP_W = re.compile(r"((?<=\s)-w[ \t]+)([^\s\"']+|\"[^\"\n]*\"|'[^'\n]*')")
_LDAP_COMMAND = re.compile(r"(?i)\bldap(?:search|modify|add|delete|passwd|whoami|compare|modrdn)\b")
# net use X: \\host\share /user:DOMAIN\name PASSWORD
_NET_USE = re.compile(r"(?i)(\bnet[ \t]+use\b[^\n]{0,256}?/user:\S+[ \t]+)([^\s/][^\s]*)")
# redis AUTH [user] password (the command is written in capitals)
_REDIS_AUTH = re.compile(r"((?<![A-Za-z0-9_])AUTH[ \t]+(?:[A-Za-z0-9_.\-]{1,64}[ \t]+)?)([^\s\"']{6,256})(?=[ \t]*$)",
                         re.MULTILINE)
# auth=("user", "password"), HTTPBasicAuth("user", "password")
_AUTH_TUPLE = re.compile(r"(?i)((?:\bauth[ \t]*=[ \t]*\(|BasicAuth\()[ \t]*[\"'][^\"'\n]{0,128}[\"'][ \t]*,[ \t]*[\"'])"
                         r"([^\"'\n]{1,256})(?=[\"'])")
# Terraform: variable "db_password" { ... default = "..." }
_TF_DEFAULT = re.compile(r"(?i)(\bvariable[ \t]+\"[^\"\n]{0,64}?" + _SECRET_KEYWORD
                         + r"[^\"\n]{0,64}\"[ \t]*\{[^{}]{0,256}?\bdefault[ \t]*=[ \t]*\")([^\"\n]{1,256})(?=\")")
# "my password is hunter2", "the password for the vpn is X"
_PROSE_PASSWORD = re.compile(
    r"(?i)\b((?:password|passphrase|passwd|passcode|pin|secret(?: key)?|api key|token|pre-shared key|psk)\b"
    r"[^.\n:=]{0,40}?\s(?:is|was|=)\s+)"
    r"([^\s,;]{3,})"
)
# aws_secret_access_key-like 40-char values next to an AWS word
_AWS_SECRET = re.compile(r"(?i)(aws[A-Za-z0-9_\-]{0,64}[ \t]{0,8}[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}")
# A free-standing 40-character AWS-secret-shaped token (mixed case and a digit or a
# slash/plus): a secret key pasted into prose. A 40-hex git hash is one case only.
_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_SMALL, _CAPITAL, _DIGIT, _DIGIT_OR_SIGN = (re.compile("[a-z]"), re.compile("[A-Z]"), re.compile("[0-9]"),
                                             re.compile("[0-9/+]"))


def _mask_aws_shape(m: re.Match[str]) -> str:
    """The 40 characters when they mix small letters, capitals and a digit or sign."""
    run = m.group(0)
    return MASK if _SMALL.search(run) and _CAPITAL.search(run) and _DIGIT_OR_SIGN.search(run) else run
# curl -u user:pass / --user user:pass / --user=user:pass
_CURL_USER = re.compile(r"(?i)((?<=\s)(?:-u|--user)(?:[ \t]+|=)[\"']?[^\s:\"']{1,256}:)([^\s\"']+)")
# mysql -pSECRET / --password=SECRET (a bare -p prompts: nothing to hide)
_MYSQL_P = re.compile(r"(?i)((?<=\s)(?:-p|--password=))([^\s\"'`]+|\"[^\"\n]*\"|'[^'\n]*')")
# sshpass -p SECRET, docker login -p SECRET, --password SECRET
_DASH_P = re.compile(r"(?i)((?<=\s)(?:-p|--password)(?:[ \t]+|=))([^\s\"']+|\"[^\"\n]*\"|'[^'\n]*')")
# The command an option above must follow on its line (looked for in at most 512 characters before it)
_CURL_COMMAND = re.compile(r"(?i)\bcurl\b")
_MYSQL_COMMAND = re.compile(r"(?i)\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\b")
_DASH_P_COMMAND = re.compile(r"(?i)\b(?:sshpass|docker\s+login|podman\s+login|helm\s+registry\s+login)\b")


def _after_command(command: re.Pattern[str]) -> Callable[[re.Match[str]], str]:
    """A replacement that masks the option's value when ``command`` comes earlier on its line."""
    def repl(m: re.Match[str]) -> str:
        text = m.string
        start = max(0, m.start() - 512)
        line_start = text.rfind("\n", start, m.start()) + 1
        if command.search(text, max(start, line_start), m.start()):
            return f"{m.group(1)}{MASK}"
        return m.group(0)
    return repl
# Cookie: a=b; c=d  and  Set-Cookie: a=b; Path=/
_COOKIE = re.compile(r"(?im)\b((?:set-)?cookie\s*:\s*)([^\n]+)")
_COOKIE_PAIR = re.compile(r"(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]{1,128}=)([^;\s]+)")
_COOKIE_ATTRS = {"path=", "domain=", "expires=", "max-age=", "samesite=", "priority="}
# .pgpass: hostname:port:database:username:password
# (a line of its own or the end of one; the host is ``*`` or has a letter or a dot)
_PGPASS = re.compile(r"(?m)((?:^|(?<=\s))(?:\*|(?=[^:\s#]{0,253}[A-Za-z.])[^:\s#]{1,253}):(?:\d{1,5}|\*)"
                     r":[^:\s]{1,128}:[^:\s]{1,128}:)(\S{1,512})"
                     r"(?=[ \t]*$)")
_PGPASS_PORT = re.compile(r":(?:\d{1,5}|\*):")  # in every .pgpass match, and found by its literal start
# A Twilio auth token (32 hex) named as such
_TWILIO = re.compile(r"(?i)(\btwilio\b[^\n]{0,40}?)\b[0-9a-f]{32}\b")


# -- forms outside single-line key=value ---------------------------------------------------
# .netrc: "machine h login u password p" on one line, or "password p" on a line of its own
_NETRC = re.compile(r"(?i)(\b(?:machine|default|login|account)\b[^\n]{0,256}?[ \t]password[ \t]+)(?![\[*])(\S+)")
_NETRC_LINE = re.compile(r"(?im)(^[ \t]*password[ \t]+)(?![\[*])(\S+)")
# JSON/YAML "auth": "<base64>" (Docker's config.json)
_QUOTED_AUTH = re.compile(r"(?i)([\"']auth[\"'][ \t]{0,8}:[ \t]{0,8}[\"'])([A-Za-z0-9+/=_\-]{8,})")
# "sig=..." (a SAS or request signature) standing on its own, not only after ? or &
_BARE_SIG = re.compile(r"(?i)((?<![A-Za-z0-9_\-])(?:sig|signature)=)[^&#\s;]+")
# Incoming-webhook URLs (Teams, Office 365, Google Chat, generic /hooks/ paths): the path is the secret
_WEBHOOK_URL = re.compile(r"(?i)(https?://[A-Za-z0-9.\-]{1,253}(?::\d{1,5})?/(?:[A-Za-z0-9_.\-]{1,64}/){0,4}?"
                          r"(?:webhook|webhookb2|webhooks|hooks|IncomingWebhook)/)[^\s\"'<>)]+")
# PuTTY key file: the lines under "Private-Lines: N" (and "Private-MAC:")
_PUTTY_PRIVATE = re.compile(r"(?m)^((?:Private-Lines|Private-MAC)[ \t]*:[ \t]*(?:\d{1,3}[ \t]*\n)?)"
                            r"((?:[ \t]*[A-Za-z0-9+/=]{1,256}[ \t]*(?:\n|\Z)){1,64})")
# A long base64 run (a key body without its header: OpenSSH, PuTTY, PEM data in a kubeconfig,
# a token): 60+ characters with capitals, small letters and digits, few slashes (not a path).
_BLOB = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/]{60,}={0,2}(?![A-Za-z0-9+/=_\-])")
# A YAML block scalar under a secret key ("password: >-" / "token: |"): its indented lines
_BLOCK_SCALAR_KEY = re.compile(r"(?i)^([ \t]*)[\"']?" + _SECRET_WORD
                               + r"[\"']?[ \t]*[:\uff1a][ \t]*[>|][+\-0-9]{0,2}[ \t]*$")
# A token-only line right after a line that ends in a mask: the rest of a value split over two lines
# (a "\\" may end the masked line; the rest has a digit and no "=" but base64 padding, so the
# next config line, PORT=8080, is never taken for it)
_CONTINUATION = re.compile(r"(?m)((?:\[REDACTED\]|\*\*\*)[\"']?[ \t]*\\?\n[ \t]*)"
                           r"((?=[A-Za-z_+/.\-]{0,511}[0-9])[A-Za-z0-9_+/.\-]{8,512}={0,2})"
                           r"(?=[\"'?.,;:!)]{0,3}[ \t]*$|[\"'])")


_DATA_URI = re.compile(r"(?i)data:[a-z]{1,16}/[a-z0-9.+\-]{1,64}(?:;[a-z\-]{1,32}=[^;,\s]{1,64}){0,4};base64,\Z")


def _mask_blob(m: re.Match[str]) -> str:
    run = m.group(0)
    if run.count("/") * 16 > len(run):
        return run  # a path
    if _DATA_URI.search(m.string, max(0, m.start() - 160), m.start()):
        return run  # the content of a data: URI (an image, a font), not a key
    return MASK if _SMALL.search(run) and _CAPITAL.search(run) and _DIGIT.search(run) else run


# A bare token (no spaces, quotes, ``%``, ``&``, ``=`` or ``:`` inside; base64 padding at its end) of
# 12+ characters: masked when it looks generated (:mod:`.shape`)
_TOKEN_CHARS = r"A-Za-z0-9+/_\-.$~!@#*"
_BARE_TOKEN = re.compile(rf"(?<![{_TOKEN_CHARS}])[{_TOKEN_CHARS}]{{12,}}={{0,2}}(?![{_TOKEN_CHARS}])")
_TOKEN_EDGES = "._-~$/+*!#"
_TOKEN_PART = re.compile(r"[^/._\-]+")


# A digest named by its algorithm, in base64 of that digest's length: a Subresource
# Integrity value (``sha512-…``), a go.sum ``h1:`` line; like a hex digest, a record, not a key
_NAMED_DIGEST = re.compile(r"(?i)(?:sha1[-:][A-Za-z0-9+/]{27}=|(?:sha256[-:]|h1:)[A-Za-z0-9+/]{43}="
                           r"|sha384[-:][A-Za-z0-9+/]{64}|sha512[-:][A-Za-z0-9+/]{86}==)")


def _mask_generated(m: re.Match[str]) -> str:
    """A generated-looking token masked (its edge punctuation kept); in a path or a URL's
    path (a token that starts with ``/``, ``~/`` or ``./``) only its generated parts."""
    token = m.group(0)
    if not shape.looks_generated(token):
        return token
    if _NAMED_DIGEST.fullmatch(m.string, max(0, m.start() - 3), m.end()) or _NAMED_DIGEST.fullmatch(token):
        return token
    before = max(0, m.start() - 160)
    if m.string.find("base64,", before, m.start()) >= 0 and _DATA_URI.search(m.string, before, m.start()):
        return token  # the content of a data: URI (an image, a font), not a key
    if token.startswith(("/", "~/", "./")):
        return _TOKEN_PART.sub(lambda p: MASK if shape.part_looks_generated(p.group(0)) else p.group(0), token)
    core = token.strip(_TOKEN_EDGES).rstrip("=") or token
    start = token.find(core)
    return token[:start] + MASK + token[start + len(core):]


# A name that says its value is a credential, in any common syntax: ``Subscription-Key:
# …``, ``define('AUTH_KEY', '…')``, ``api key -> …``, ``--token …``, ``"signature" => "…"``,
# ``the dsn is …``. Tried where the word occurs; the value is masked when it looks like a
# credential (:func:`.shape.value_looks_secret`), so ``primary_key: id`` stays.
_CONTEXT_WORD = (r"(?i:password|passwd|passphrase|passcode|pass|pwd|keys|key|oauth|auth|signature|sig|dsn|credentials"
                 r"|credential|creds|cred|salt|seed|secret|token|psk|private)")
_CONTEXT_VALUE = re.compile(
    _CONTEXT_WORD + r"(?P<suffix>[A-Za-z0-9_.\-]{0,32})[\"'`]?"
    r"(?P<sep>[ \t]{0,8}(?:=>|:=|->|\u2192|==|[=:\uff1a\uff1d]|,)[ \t]{0,8}|[ \t]{1,8}(?:(?:is|was|are)[ \t]{1,8})?)"
    r"(?P<q>[\"'`]?)(?P<value>[^\s\"'`,;)}\]<>|]{8,256})")
_CONTEXT_TRIGGERS = ("pass", "pwd", "key", "oauth", "auth", "sig", "dsn", "cred", "salt", "seed", "secret", "token",
                     "psk", "private")
# What may follow the word in the name: nothing, digits, or a new part (``KEY_PROD``,
# ``Key2``, ``-key-v2``), never more of a longer word (``keyboard``, ``tokenizer``, ``passage``)
_NAME_SUFFIX = re.compile(r"(?:[0-9]{0,4}(?:[_.\-][A-Za-z0-9_.\-]{0,28})?|[A-Z][A-Za-z0-9_.\-]{0,31})")
# Short command-line options that take a password or a key: -p, -P, -w, -N, -k (after a space)
_SHORT_FLAG = re.compile(r"-[pPwNk](?:[ \t]{1,8}|=)?(?P<q>[\"'`]?)(?P<value>[^\s\"'`,;)}\]<>|]{8,256})")


def _mask_context_value(m: re.Match[str]) -> str:
    value = m.group("value").rstrip(".!?:")
    if value.startswith("[REDACTED") or MASK in value or rule_set.is_placeholder(value):
        return m.group(0)
    if "suffix" in m.groupdict():
        suffix = m.group("suffix")
        if not _NAME_SUFFIX.fullmatch(suffix) or (suffix and _NOT_SECRET_SUFFIX.search(suffix)):
            return m.group(0)  # keyboard, tokenizer, keyName, token_uri
        start = m.start()
        if start and (m.string[start - 1].isalpha() and m.string[start - 1].islower()
                      and m.group(0)[0].islower()):
            return m.group(0)  # monkey, turnkey: the word inside a longer one
    elif m.start() and not m.string[m.start() - 1].isspace():
        return m.group(0)  # an option only after a space
    if not shape.value_looks_secret(value):
        return m.group(0)
    head = m.group(0)[: m.start("value") - m.start()]
    return head + MASK + m.group(0)[m.start("value") - m.start() + len(value):]


def redact_block_scalars(text: str) -> str:
    """The indented lines of a YAML block scalar (``>``/``|``) under a secret key."""
    if ">" not in text and "|" not in text:
        return text
    lines = text.split("\n")
    indent: int | None = None
    for i, line in enumerate(lines):
        if indent is not None:
            stripped = line.lstrip(" \t")
            if stripped and len(line) - len(stripped) > indent:
                lines[i] = line[: len(line) - len(stripped)] + MASK
                continue
            if stripped:
                indent = None
        if len(line) <= 512:
            m = _BLOCK_SCALAR_KEY.match(line)
            if m:
                indent = len(m.group(1))
    return "\n".join(lines)


def _mask_continuation(m: re.Match[str]) -> str:
    """The rest of a split value when it looks like one (a word with a number, ``release2024``, is not)."""
    return f"{m.group(1)}{MASK}" if shape.value_looks_secret(m.group(2).rstrip("=")) else m.group(0)


def redact_continuations(text: str) -> str:
    """A value split over two lines: the token-only line after a masked line end."""
    return rule_set.sub_near(_CONTINUATION, _mask_continuation, text, _MASK_TRIGGERS, before=16, after=600)


_MASK_TRIGGERS = ("[redacted]", "***")
_BLOCK_SCALAR_HINT = re.compile(r"[:\uff1a][ \t]*[>|][+\-0-9]{0,2}[ \t]*$", re.MULTILINE)


# The rest of a token an earlier mask only half covered (a zero-width character split
# the key when another redactor ran, so it masked the head): mask glued to 8+ token
# characters with a digit among them.
_MASK_REMAINDER = re.compile(r"(?:\*{3}|\[REDACTED\])(?=[A-Za-z0-9_/+=\-]*\d)[A-Za-z0-9_/+=\-]{8,}")

_COUNT = re.compile(r"[~\d.,_kKmM]+")
# A value that is code, not a credential: a call, an index or the end of a signature
# (``get_token(session_id)``, ``reverse(``, ``str)``, ``environ[``), or a type name.
_CODE_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,128}[(\[)]")
_TYPE_NAMES = frozenset({"str", "bytes", "int", "bool", "none", "null", "nil", "undefined", "true", "false",
                         "string", "secretstr", "optional", "any", "object"})
# A plain word: what follows "the secret to X is" in prose is a word, not a password
_PLAIN_WORD = re.compile(r"[a-z]{1,15}[.,;:!?)]{0,3}")


def _redact_assignment(m: re.Match[str]) -> str:
    quote = m.group("q") or ""
    value = m.group("quoted") if quote else m.group("value")
    if value.startswith("[REDACTED") or value == "***":
        return m.group(0)
    key = m.group("key")
    if "tokens" in key.lower() and _COUNT.fullmatch(value):
        return m.group(0)  # a token count ("prompt_tokens=41,442"), not a credential
    if (_NOT_SECRET_SUFFIX.search(key) and "private" not in key.lower()) or rule_set.is_placeholder(value):
        return m.group(0)  # a name, address or path of a secret (token_uri, secretName), or a placeholder
    if not quote and (_CODE_VALUE.match(value) or value.lower() in _TYPE_NAMES):
        return m.group(0)  # code: token = get_token(session_id), password: str) -> Session
    return f"{key}{quote}{MASK}{quote}"


# A cookie's name that says its value is a credential
_SECRET_COOKIE_NAME = re.compile(r"(?i)sess|sid|token|auth|key|secret|jwt|csrf|xsrf|login|remember|pass")
# A cookie value that is a setting, not a credential: a short word (theme=dark, lang=en)
_COOKIE_SETTING = re.compile(r"[A-Za-z_\-]{1,12}")


def _redact_cookie(m: re.Match[str]) -> str:
    def pair(p: re.Match[str]) -> str:
        name = p.group(1)
        if name.lower() in _COOKIE_ATTRS:
            return p.group(0)
        if _COOKIE_SETTING.fullmatch(p.group(2)) and not _SECRET_COOKIE_NAME.search(name):
            return p.group(0)
        return f"{name}{MASK}"

    return m.group(1) + _COOKIE_PAIR.sub(pair, m.group(2))


def _keep_head(m: re.Match[str]) -> str:
    return f"{m.group(1)}{MASK}"


# A word between the keyword and "is" that makes the sentence about something else than the
# secret's value: "the token count was 41442", "the API key name is ProdKey2024Main"
_PROSE_ABOUT = re.compile(r"(?i)\b(?:names?|ids?|counts?|length|size|limit|budget|usage|type|format|expiry|ttl"
                          r"|file|path|url|prefix|policy|version)\b")


def _redact_prose_password(m: re.Match[str]) -> str:
    value = m.group(2)
    if (value.startswith("[REDACTED") or _PLAIN_WORD.fullmatch(value) or _CODE_VALUE.match(value)
            or rule_set.is_placeholder(value.rstrip(".,;:!?")) or _PROSE_ABOUT.search(m.group(1))):
        return m.group(0)  # "the secret to good BPE is merges", "the token is invalid", "the token count was 4"
    return m.group(1) + MASK


def _redact_userinfo(m: re.Match[str]) -> str:
    userinfo = m.group(0)[len(m.group(1)):-1]
    password = userinfo.partition(":")[2]
    if password and rule_set.is_placeholder(password):
        return m.group(0)  # postgresql://user:password@localhost: the documentation's placeholder
    return f"{m.group(1)}{MASK}@"


def _redact_secretish(m: re.Match[str]) -> str:
    """The value of group 2 masked unless it is a plain word, a type name, code or a placeholder."""
    value = m.group(2).strip()
    if (value.startswith("[REDACTED") or _PLAIN_WORD.fullmatch(value) or value.lower() in _TYPE_NAMES
            or _CODE_VALUE.match(value) or rule_set.is_placeholder(value)):
        return m.group(0)
    return m.group(1) + m.group(2).replace(value, MASK, 1)


def _redact_key_header(m: re.Match[str]) -> str:
    if _NOT_SECRET_SUFFIX.search(m.group(1)):
        return m.group(0)  # X-Auth-Email, X-Api-Key-Id: names the credential's owner, not the credential
    return f"{m.group(1)}{MASK}"


def _redact_auth_header(m: re.Match[str]) -> str:
    return f"{m.group(1)}{(m.group(2) + ' ') if m.group(2) else ''}{MASK}"


# The first characters of every _SECRET_KEYWORD alternative: _ASSIGNMENT is tried where one occurs
_SECRET_WORD_TRIGGERS = ("pass", "pw", "psk", "secret", "token", "api", "access", "private", "client", "credential",
                         "auth", "app", "session", "key", "密", "口令", "令牌", "秘", "暗号", "パスワード", "비밀번호",
                         "비번", "토큰", "пароль", "токен")
# The guard's rules in order: (pattern, replacement, the literal text a match contains or
# lies next to, or a pattern a match contains; the pattern runs only near it; empty: over
# the whole text). A rule whose
# matches start with the literal is in _ANCHORED_RULES: it is tried only where that occurs.
_GUARD_RULES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str],
                         tuple[str, ...] | re.Pattern[str]]] = [
    (_TOKENS, MASK, _TOKEN_TRIGGERS),
    (_TELEGRAM, MASK, _TELEGRAM_SECRET),
    (_TWILIO_SID, MASK, ("SK", "AC")),
    (_URL_USERINFO, _redact_userinfo, ("://",)),
    (_URL_SECRET_PARAM, _keep_head, ("token", "key", "secret", "password", "passwd", "pwd", "sig", "x-amz", "auth",
                                     "code")),
    (_AZURE, _keep_head, ("accountkey", "sharedaccess")),
    (_AUTH_HEADER, _redact_auth_header, ("authorization",)),
    (_BEARER, _keep_head, ("bearer",)),
    (_KEY_HEADER, _redact_key_header, ("x-",)),
    (_COOKIE, _redact_cookie, ("cookie",)),
    (_CURL_USER, _after_command(_CURL_COMMAND), ("curl",)),
    (_MYSQL_P, _after_command(_MYSQL_COMMAND), ("mysql", "mariadb")),
    (_DASH_P, _after_command(_DASH_P_COMMAND), ("sshpass", "login")),
    (_PGPASS, _keep_head, _PGPASS_PORT),
    (_TWILIO, _keep_head, ("twilio",)),
    (_AWS_SECRET, _keep_head, ("aws",)),
    (_AWS_SECRET_SHAPE, _mask_aws_shape, ()),
    (_NETRC, _redact_secretish, ("machine", "default", "login", "account")),
    (_NETRC_LINE, _keep_head, ("password",)),
    (_QUOTED_AUTH, _keep_head, ("auth",)),
    (_BARE_SIG, _keep_head, ("sig",)),
    (_WEBHOOK_URL, _keep_head, ("hook",)),
    (_PUTTY_PRIVATE, _keep_head, ("private-",)),
    (_BLOB, _mask_blob, ()),
    (_KEYTOOL_PASS, _redact_secretish, ("pass",)),
    (_LDAP_W, _after_command(_LDAP_COMMAND), ("ldap",)),
    (_NET_USE, _redact_secretish, ("net",)),
    (_REDIS_AUTH, _redact_secretish, ("AUTH",)),
    (_AUTH_TUPLE, _keep_head, ("auth",)),
    (_TF_DEFAULT, _keep_head, ("variable",)),
    (_XML_KEYED_VALUE, _keep_head, ("value",)),
    (_XML_ELEMENT, _redact_secretish, ("</",)),
    (_TABLE_ROW, _redact_secretish, ("|",)),
    (_ENV_KEY, _keep_head, ("_KEY",)),
    (_ASSIGNMENT, _redact_assignment, _SECRET_WORD_TRIGGERS),
    (_PROSE_PASSWORD, _redact_prose_password, ("password", "passphrase", "passwd", "passcode", "pin", "secret",
                                               "api key", "token", "pre-shared", "psk")),
    (_PASSWORD_VALUE, _redact_secretish, ("password", "passwd", "passphrase", "pw")),
    (_CONTEXT_VALUE, _mask_context_value, _CONTEXT_TRIGGERS),
    (_SHORT_FLAG, _mask_context_value, ("-p", "-P", "-w", "-N", "-k")),
    (_BARE_TOKEN, _mask_generated, ()),
]

_ANCHORED_RULES = {_TOKENS, _NETRC, _ASSIGNMENT, _PROSE_PASSWORD, _CONTEXT_VALUE, _SHORT_FLAG}


def redact_guard_patterns(text: str, with_rule_sets: bool = True) -> str:
    """The guard's own pass (on normalised text): the provider rule sets
    (:mod:`.rule_set`, skipped with ``with_rule_sets=False``) and the guard's rules;
    every match becomes ``[REDACTED]``."""
    if not text:
        return text
    text = normalise(text)
    text = _PRIVATE_KEY.sub(MASK, text)
    # where the literals occur, found once and kept while no rule changes the text
    found = rule_set.Occurrences(text)
    # before the rule sets mask the SID that tells the token beside it
    text = rule_set.sub_near(_TWILIO_PAIR, _keep_head, text, ("SK", "AC"), found=found)
    if found.text is not text:
        found = rule_set.Occurrences(text)
    if with_rule_sets:
        with failing_open("the provider rule pass", "the guard's own rules still apply", advice=None,
                          level=logging.WARNING):
            text = rule_set.redact_with_rules(text, MASK, found)
    for pattern, repl, triggers in _GUARD_RULES:
        if found.text is not text:
            found = rule_set.Occurrences(text)
        if not triggers:
            text = pattern.sub(repl, text)
        elif pattern in _ANCHORED_RULES and isinstance(triggers, tuple):
            text = rule_set.sub_at(pattern, repl, text, triggers, found)
        else:
            text = rule_set.sub_near(pattern, repl, text, triggers, found=found)
    if _BLOCK_SCALAR_HINT.search(text):
        text = redact_block_scalars(text)
    text = rule_set.sub_near(_MASK_REMAINDER, MASK, text, _MASK_TRIGGERS)
    return redact_continuations(text)


def redact(text: str, host_redactor: Callable[[str], str] | None = None,
           known: frozenset[str] = frozenset()) -> str:
    """All passes: normalise, the provider rule sets and the guard's rules, the values
    in ``known`` (:func:`mask_known`), then the host's function (``None``: skipped) under
    :func:`host_pass`'s bounds. A failing pass never undoes the ones before it."""
    if not text:
        return text
    return host_pass(mask_known(redact_guard_patterns(text), known), host_redactor)


# -- values seen with their context, masked wherever they are echoed -------------------
MIN_KNOWN_CHARS = 6
MAX_KNOWN_VALUES = 2_000
_PLAIN_LOWER = re.compile(r"[a-z]{1,9}")


def masked_values(text: str) -> frozenset[str]:
    """The values the guard's pass masks in ``text`` (what each ``[REDACTED]`` stands for),
    so that the bare value can be masked where it is echoed without its context. Values
    shorter than :data:`MIN_KNOWN_CHARS`, short plain words, placeholders and values over
    a line are left out."""
    if not text:
        return frozenset()
    text = normalise(text)
    pieces = redact_guard_patterns(text).split(MASK)
    if len(pieces) == 1 or not text.startswith(pieces[0]):
        return frozenset()
    values: set[str] = set()
    pos = len(pieces[0])
    for i, piece in enumerate(pieces[1:], 1):
        if i == len(pieces) - 1:
            end = len(text) - len(piece)
        else:
            end = text.find(piece[:64], pos) if piece else pos
        if end < pos:
            break  # out of step (a rule rewrote more than the value): what was found so far stands
        value = text[pos:end].strip().strip("\"'`")
        if (len(value) >= MIN_KNOWN_CHARS and "\n" not in value and MASK not in value
                and not _PLAIN_LOWER.fullmatch(value) and not rule_set.is_placeholder(value)):
            values.add(value)
        pos = end + len(piece)
    return frozenset(values)


def mask_known(text: str, known: frozenset[str]) -> str:
    """``text`` with every occurrence of a value in ``known`` masked (the longest first)."""
    if not known or not text:
        return text
    present = sorted((v for v in known if v in text), key=len, reverse=True)[:MAX_KNOWN_VALUES]
    if not present:
        return text
    return re.sub("|".join(map(re.escape, present)), MASK, text)
