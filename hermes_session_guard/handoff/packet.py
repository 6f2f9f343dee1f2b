"""The hand-off packet: a compact, redacted Markdown brief of a session, written
atomically with mode 0600 under ``$HERMES_HOME/<handoff.artifact_dir>``.

Nothing here imports Hermes: callers collect a :class:`PacketInputs` (see
:mod:`hermes_session_guard.handoff.writer`) and pass the host's redaction function in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..config import relative_path_problem
from ..file_modes import LinkRefused
from ..files import atomic_write_text, create_file
from ..store import message_text
from ..summaries.tags import is_summary_message, summary_body, text_without_summary
from .redaction import host_pass, mask_known, masked_values, redact, redact_guard_patterns

PACKET_HEADING = "# Session hand-off packet"
# The first line of the message that seeds a child session (recognised when a
# later packet is built from that session, so packets do not nest).
SEED_MARKER = "[SESSION HAND-OFF — REFERENCE ONLY]"
TODO_MARKER = "[Your active task list was preserved across context compression]"

MAX_SUMMARY_CHARS = 6000
MAX_REQUEST_CHARS = 2000
MAX_NOTE_CHARS = 2000
MAX_QUESTIONS = 10
MAX_QUESTION_CHARS = 300
MAX_SNAPSHOTS = 20
MAX_TITLE_CHARS = 300
MAX_WORKING_DIR_CHARS = 1000
MAX_TODOS = 50
MAX_TODO_CHARS = 500
# A field is cut to its limit plus this margin before it is redacted (and to its limit
# after): every secret that starts inside the limit lies whole in what is redacted
# (the rules take values up to 512 characters), and no pass sees an unbounded text.
CLIP_MARGIN = 4096
# How much of a session's text is read for values seen with their context (the newest part)
MAX_SESSION_SCAN_CHARS = 4_000_000

_OPEN_HEADINGS = ("pending user asks", "blocked", "open question", "unresolved", "unanswered")


class PathEscapeError(ValueError):
    """The packet would be written outside ``HERMES_HOME``; nothing was written."""


@dataclass(frozen=True)
class SnapshotPointer:
    snapshot_id: str
    message_count: int
    created_at: float


@dataclass
class PacketInputs:
    session_id: str
    lineage: list[str] = field(default_factory=list)  # root first, ending with session_id
    title: str | None = None
    working_dir: str | None = None
    git_branch: str | None = None
    git_commit: str | None = None
    todos: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None
    last_user_request: str | None = None
    open_questions: list[str] = field(default_factory=list)
    snapshots: list[SnapshotPointer] = field(default_factory=list)
    compressions: int = 0
    reason: str = ""
    note: str | None = None
    created_at: float = 0.0
    # values the guard masked where they appeared with their context in the session
    # (:func:`session_secret_values`): masked wherever the packet echoes them bare
    secret_values: frozenset[str] = frozenset()


# -- reading a transcript --------------------------------------------------------------
def _is_todo_text(text: str) -> bool:
    return text.lstrip().startswith(TODO_MARKER)


def _is_seed_text(text: str) -> bool:
    return text.lstrip().startswith(SEED_MARKER)


def latest_summary(messages: list[Any]) -> str | None:
    for m in reversed(messages):
        text = message_text(m) if isinstance(m, dict) else None
        if text and is_summary_message(m):
            return summary_body(text) or None
        if text and _is_seed_text(text):
            # a child seeded by an earlier packet: its summary section is the latest summary
            section = markdown_section(text, "Latest summary")
            if section:
                return section
    return None


def user_request_text(message: Any) -> str | None:
    """What the person (or peer agent) wrote in a user turn, without a compaction
    summary merged into it; ``None`` for summaries, todo snapshots and hand-off
    seeds the host or the guard inserted."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    text = message_text(message) or ""
    if _is_todo_text(text) or _is_seed_text(text):
        return None
    if not is_summary_message(message):
        return text.strip() or None  # the person's words, even when they quote the summary prefix
    return text_without_summary(text).strip() or None


def last_user_request(messages: list[Any]) -> str | None:
    for m in reversed(messages):
        text = user_request_text(m)
        if text:
            return text
    return None


def todos_from_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The todo list the host injected at the last compression (``- [>] 2. text (in_progress)``)."""
    line = re.compile(r"^-\s*\[(?P<mark>.)\]\s*(?P<id>[^.\s]+)\.\s*(?P<content>.*?)(?:\s+\((?P<status>[a-z_]+)\))?$")
    for m in reversed(messages):
        text = message_text(m) if isinstance(m, dict) else None
        if not text or not _is_todo_text(text):
            continue
        out = []
        for raw in text.splitlines()[1:]:
            found = line.match(raw.strip())
            if found:
                out.append({"id": found["id"], "content": found["content"], "status": found["status"] or "pending"})
        return out
    return []


def markdown_section(text: str, heading_words: str) -> str | None:
    """The body under the first ``#``-heading containing ``heading_words`` (case-insensitive)."""
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        stripped = raw.strip()
        if stripped.startswith("#") and heading_words.lower() in stripped.lower():
            level = len(stripped) - len(stripped.lstrip("#"))
            body = []
            for nxt in lines[i + 1:]:
                s = nxt.strip()
                if s.startswith("#") and len(s) - len(s.lstrip("#")) <= level:
                    break
                body.append(nxt)
            return "\n".join(body).strip() or None
    return None


def session_secret_values(messages: list[Any]) -> frozenset[str]:
    """The values the guard's rules mask in the session's messages (the newest
    :data:`MAX_SESSION_SCAN_CHARS` characters of them), for :func:`redaction.mask_known`."""
    texts: list[str] = []
    size = 0
    for m in reversed(messages):
        text = message_text(m) if isinstance(m, dict) else None
        if text:
            texts.append(text)
            size += len(text) + 2
            if size >= MAX_SESSION_SCAN_CHARS:
                break
    joined = "\n\n".join(reversed(texts))
    return masked_values(joined[-MAX_SESSION_SCAN_CHARS:])


def open_questions(summary: str | None, messages: list[Any],
                   clean: Callable[[str], str] = redact_guard_patterns) -> list[str]:
    """Items under the summary's open-ended headings (``Pending User Asks``,
    ``Blocked``, ...) and questions the assistant asked in its last reply. The summary
    and the reply are redacted whole (``clean``) before they are cut into items, so a
    secret with a dot in it (a JWT, a SendGrid key, a password) is masked whole, never
    its tail alone; each text is cut to a bound first (:func:`_bounded`)."""
    found: list[str] = []
    if summary:
        summary = clean(_bounded(summary, MAX_SUMMARY_CHARS))
        for heading in _OPEN_HEADINGS:
            section = markdown_section(summary, heading)
            for raw in (section or "").splitlines():
                item = raw.strip().lstrip("-*0123456789.) ").strip()
                if item and item.lower() not in ("none", "none.", "n/a", "(none)", "nothing"):
                    found.append(item)
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "assistant" and (message_text(m) or "").strip():
            if is_summary_message(m):
                break
            text = clean(_bounded(message_text(m) or "", MAX_QUESTIONS * MAX_QUESTION_CHARS, tail=True))
            for sentence in re.findall(r"[^.!?\n]*\?", text):
                sentence = sentence.strip()
                if len(sentence) > 3:
                    found.append(sentence)  # clipped when rendered, after redaction
            break
    out: list[str] = []
    for item in found:
        if item not in out:
            out.append(item)
    return out[:MAX_QUESTIONS]


# -- rendering -------------------------------------------------------------------------
def _bounded(text: str, limit: int, tail: bool = False) -> str:
    """``text`` cut to ``limit`` + :data:`CLIP_MARGIN` characters (its end with ``tail``),
    before it is redacted and clipped to ``limit``."""
    bound = limit + CLIP_MARGIN
    if len(text) <= bound:
        return text
    return text[-bound:] if tail else text[:bound]


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _clip_head(text: str, limit: int) -> str:
    """The end of ``text`` (a question's end is its point)."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:].lstrip()


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


def _ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_packet(inputs: PacketInputs, host_redactor: Callable[[str], str] | None = None) -> str:
    """The packet as Markdown, redacted: every piece of conversation text (title, note,
    request, todos, summary, questions) is cut to its limit plus a margin
    (:func:`_bounded`), goes through :func:`redaction.redact` and is then clipped to its
    limit, so a secret cut in half by a length limit is never left half-visible and no
    pass sees an unbounded text; a value masked with its context anywhere in the session
    or the packet (``inputs.secret_values``, :func:`redaction.masked_values`) is masked
    where it is echoed bare; the whole packet then gets the guard's rules and the host's
    redaction (line by line) once more."""
    fields = [(inputs.title, MAX_TITLE_CHARS, False), (inputs.working_dir, MAX_WORKING_DIR_CHARS, False),
              (inputs.note, MAX_NOTE_CHARS, False), (inputs.last_user_request, MAX_REQUEST_CHARS, False),
              (inputs.summary, MAX_SUMMARY_CHARS, False)]
    fields += [(q, MAX_QUESTION_CHARS, True) for q in inputs.open_questions]
    fields += [(str(item.get("content", "")), MAX_TODO_CHARS, False) for item in inputs.todos[:MAX_TODOS]]
    known = inputs.secret_values | masked_values("\n\n".join(_bounded(t, limit, tail)
                                                              for t, limit, tail in fields if t))

    def clean(text: str | None, limit: int, tail: bool = False) -> str | None:
        return redact(_bounded(text, limit, tail), host_redactor, known) if text else text

    inputs = replace(
        inputs,
        title=_clip(clean(inputs.title, MAX_TITLE_CHARS) or "", MAX_TITLE_CHARS) or None,
        working_dir=_clip(clean(inputs.working_dir, MAX_WORKING_DIR_CHARS) or "", MAX_WORKING_DIR_CHARS) or None,
        note=clean(inputs.note, MAX_NOTE_CHARS),
        last_user_request=clean(inputs.last_user_request, MAX_REQUEST_CHARS),
        summary=clean(inputs.summary, MAX_SUMMARY_CHARS),
        open_questions=[_clip_head(clean(q, MAX_QUESTION_CHARS, tail=True) or "", MAX_QUESTION_CHARS)
                        for q in inputs.open_questions],
        todos=[{**item, "content": _clip(clean(str(item.get("content", "")), MAX_TODO_CHARS) or "", MAX_TODO_CHARS)}
               for item in inputs.todos[:MAX_TODOS]],
    )
    sid = inputs.session_id
    lines = [PACKET_HEADING, ""]
    lines.append(f"- Session: `{sid}`")
    lineage = inputs.lineage or [sid]
    if len(lineage) > 1:
        lines.append("- Lineage: " + " → ".join(f"`{s}`" for s in lineage))
    else:
        lines.append("- Lineage: first session of its line")
    if inputs.title:
        lines.append(f"- Title: {inputs.title}")
    if inputs.working_dir:
        lines.append(f"- Working directory: `{inputs.working_dir}`")
    if inputs.git_branch or inputs.git_commit:
        git = f"branch `{inputs.git_branch}`" if inputs.git_branch else "detached"
        if inputs.git_commit:
            git += f" at `{inputs.git_commit}`"
        lines.append(f"- Git: {git}")
    lines.append(f"- Compressions of this session: {inputs.compressions}")
    if inputs.reason:
        lines.append(f"- Written: {_ts(inputs.created_at)} ({inputs.reason})")
    if inputs.note:
        lines += ["", "## Note", "", _clip(inputs.note, MAX_NOTE_CHARS)]
    lines += ["", "## Last user request", ""]
    lines.append(_quote(_clip(inputs.last_user_request, MAX_REQUEST_CHARS)) if inputs.last_user_request
                 else "(none recorded)")
    lines += ["", "## Todo list", ""]
    if inputs.todos:
        marks = {"completed": "x", "in_progress": ">", "pending": " ", "cancelled": "~"}
        for item in inputs.todos:
            status = str(item.get("status") or "pending")
            lines.append(f"- [{marks.get(status, '?')}] {item.get('id', '?')}. {item.get('content', '')} ({status})")
    else:
        lines.append("(empty)")
    lines += ["", "## Latest summary", ""]
    lines.append(_clip(_demote_headings(inputs.summary), MAX_SUMMARY_CHARS) if inputs.summary
                 else "(no compaction summary yet)")
    lines += ["", "## Open questions", ""]
    lines += [f"- {q}" for q in inputs.open_questions] or ["(none recorded)"]
    lines += ["", "## Recall", ""]
    if inputs.snapshots:
        lines.append(f"Verbatim history of `{sid}` before each compression (read one with "
                     f"`hermes-session-guard snapshots {sid} --show SNAPSHOT_ID`):")
        shown = inputs.snapshots[-MAX_SNAPSHOTS:]
        if len(inputs.snapshots) > len(shown):
            lines.append(f"- … {len(inputs.snapshots) - len(shown)} older snapshot(s)")
        for snap in shown:
            lines.append(f"- `{snap.snapshot_id}` — {snap.message_count} messages, {_ts(snap.created_at)}")
    else:
        lines.append(f"No snapshots of `{sid}` yet.")
    if len(lineage) > 1:
        lines.append("Earlier sessions of this line: " + ", ".join(f"`{s}`" for s in lineage[:-1])
                     + " (`hermes-session-guard snapshots SESSION_ID`).")
    return host_pass(mask_known(redact_guard_patterns("\n".join(lines).rstrip() + "\n"), known), host_redactor)


_HEADING = re.compile(r"^(#{1,6})\s", re.M)


def _demote_headings(text: str) -> str:
    """The summary's top headings become ``###`` so they nest under the packet's
    ``## Latest summary`` (deeper ones keep their relative depth)."""
    levels = [len(m.group(1)) for m in _HEADING.finditer(text)]
    if not levels:
        return text.strip()
    shift = 3 - min(levels)
    return _HEADING.sub(lambda m: "#" * max(1, min(6, len(m.group(1)) + shift)) + " ", text.strip())


def seed_message_text(packet: str, parent_session_id: str) -> str:
    """The content of a child session's first message: the packet, marked as reference."""
    return (
        f"{SEED_MARKER} This conversation continues session `{parent_session_id}`, which was handed off "
        "after repeated context compressions. The packet below is background reference written by the "
        "session guard, not a new request; the latest user message after it is what to act on.\n\n" + packet
    )


# -- writing ---------------------------------------------------------------------------
def artifact_dir(home: Path, configured: str) -> Path:
    """``HERMES_HOME/<configured>``, refused (:class:`PathEscapeError`) unless it is a
    relative path without ``..``; its levels are entered without following a link when
    the packet is written (a linked directory is refused there)."""
    problem = relative_path_problem(configured)
    if problem:
        raise PathEscapeError(f"handoff.artifact_dir {configured!r} {problem}")
    return Path(home) / configured


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def packet_filename(session_id: str, created_at: float, n: int = 1) -> str:
    """``<session>.handoff.<UTC timestamp to the microsecond>.md``; like snapshot ids,
    a numeric suffix (``-2``, ``-3`` ...) keeps names unique when runs share a timestamp."""
    stamp = datetime.fromtimestamp(created_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    safe = _UNSAFE.sub("_", session_id).strip("._") or "session"
    return f"{safe[:80]}.handoff.{stamp}{'' if n <= 1 else f'-{n}'}.md"


MAX_NAME_ATTEMPTS = 10_000


def _claim_name(home: Path, directory: Path, session_id: str, created_at: float) -> Path:
    """Create the first free packet name exclusively (``O_CREAT | O_EXCL``, mode 0600,
    the home's owner's) and return it. Anything already at a name (a packet of a
    concurrent run, a file, a dangling symlink) makes it try the next suffix; a
    symlink is never followed."""
    for n in range(1, MAX_NAME_ATTEMPTS + 1):
        candidate = directory / packet_filename(session_id, created_at, n)
        try:
            create_file(candidate, b"", home=home)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"no free hand-off packet name for {session_id} in {directory}")


def write_packet(home: Path, configured_dir: str, session_id: str, text: str, created_at: float) -> Path:
    """Claim a unique name (:func:`_claim_name`), then write ``text`` atomically
    over it (sibling temp file, fsync, ``os.replace``) and return the final path;
    concurrent runs never overwrite each other's packet. Through
    :mod:`~hermes_session_guard.files`: no link under the home followed, the packet
    0600 and directories created on the way 0700, all the home's owner's when root
    writes them. On Windows ``chmod`` only toggles read-only; the file then inherits
    the directory's ACL (``HERMES_HOME`` is the user's)."""
    directory = artifact_dir(home, configured_dir)
    try:
        final = _claim_name(Path(home), directory, session_id, created_at)
    except LinkRefused as exc:
        raise PathEscapeError(f"{exc} (a link could lead outside {home}); nothing written") from exc
    try:
        atomic_write_text(final, text, home=home)
    except BaseException:
        with suppress(OSError):
            final.unlink()  # the claimed name is released again
        raise
    return final


def snapshot_pointers(infos: Iterable[Any]) -> list[SnapshotPointer]:
    return [SnapshotPointer(i.snapshot_id, i.message_count, i.created_at) for i in infos]
