"""Hand-off on the host side: reading the parent session, creating the child
session through Hermes's SessionDB, moving the agent's live identity to it and
notifying the context engine and memory providers."""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from .agent import notify_boundary
from .persistence import in_timestamp_order, rebase_flush

log = logging.getLogger("hermes_session_guard")


def host_redactor() -> Callable[[str], str] | None:
    """Hermes's own secret redaction, forced on (whatever ``security.redact_secrets``
    says) and, where the host offers it, with URL credentials included."""
    try:
        from agent.redact import redact_sensitive_text
    except ImportError as exc:
        log.warning("session guard: Hermes's agent.redact is not importable (%s: %s); no host redaction",
                    type(exc).__name__, exc)
        return None
    try:
        params = inspect.signature(redact_sensitive_text).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    kwargs: dict[str, Any] = {}
    if "force" in params:
        kwargs["force"] = True
    if "redact_url_credentials" in params:
        kwargs["redact_url_credentials"] = True
    if "code_file" in params:
        # its KEY=value / "key": "value" / key: value rules: the guard's own assignment rules
        # do that work with fewer false positives (max_tokens: 4096, secretName: app-tls)
        kwargs["code_file"] = True

    def redactor(text: str) -> str:
        return str(redact_sensitive_text(text, **kwargs))

    return redactor


def session_row(db: Any, sid: str) -> dict[str, Any] | None:
    with failing_open(f"reading the session row of {sid}", "the session is taken as having none",
                      level=logging.DEBUG, advice=None) as failed:
        row = db.get_session(sid)
    if failed:
        return None
    return dict(row) if row else None


def session_messages(db: Any, sid: str) -> list[dict[str, Any]]:
    """The live transcript (0.19: active rows only)."""
    return [dict(m) for m in db.get_messages(sid)]


def working_dir(row: dict[str, Any] | None) -> str | None:
    """The session's working directory: the session row (0.19 stores ``cwd``), the
    gateway's ``TERMINAL_CWD``, else this process's directory."""
    cwd = (row or {}).get("cwd") or os.environ.get("TERMINAL_CWD")
    if cwd:
        return str(cwd)
    try:
        return os.getcwd()
    except OSError:
        return None


def git_state(cwd: str | None, timeout: float = 2.0) -> tuple[str | None, str | None]:
    """``(branch, short commit)`` of the repository at ``cwd``; ``(None, None)`` when
    there is no repository or no ``git``."""
    if not cwd or not Path(cwd).is_dir():
        return None, None

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", cwd, *args], capture_output=True, text=True, timeout=timeout,
                stdin=subprocess.DEVNULL, creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0),
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None, None
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    return (None if branch == "HEAD" else branch), commit


def new_session_id() -> str:
    """A session id in the host's own format (``YYYYmmdd_HHMMSS_<6 hex>``)."""
    return f"{datetime.now().strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"


def create_child_session(
    db: Any, agent: Any, parent: str, child: str, messages: list[dict[str, Any]], system_prompt: str | None,
    *, transcript_order: str | None = None,
) -> None:
    """Create ``child`` (``parent_session_id=parent``) through Hermes's own SessionDB
    API, holding ``messages`` as its live transcript. Raises on failure (the caller
    then removes whatever was created). ``transcript_order`` as in :func:`persist_compacted`."""
    row = session_row(db, parent) or {}
    kwargs: dict[str, Any] = {
        "source": getattr(agent, "platform", None) or row.get("source")
        or os.environ.get("HERMES_SESSION_SOURCE", "cli"),
        "model": getattr(agent, "model", None) or row.get("model"),
        "parent_session_id": parent,
    }
    model_config = getattr(agent, "_session_init_model_config", None)
    if model_config is not None:
        kwargs["model_config"] = model_config
    for inherited in ("user_id", "cwd"):  # cwd: 0.19 rows only
        if row.get(inherited):
            kwargs[inherited] = row[inherited]
    db.create_session(session_id=child, **kwargs)
    ordered = in_timestamp_order(db, parent, messages) if transcript_order == "timestamp" else messages
    db.replace_messages(child, ordered)
    if system_prompt:
        with failing_open(f"update_system_prompt({child})", "the child's row keeps no system prompt",
                          level=logging.DEBUG, advice=None):
            db.update_system_prompt(child, system_prompt)
    with failing_open(f"carrying the title over to {child}", "the child has no title", level=logging.DEBUG,
                      advice=None):
        title = db.get_session_title(parent)
        if title:
            db.set_session_title(child, db.get_next_title_in_lineage(title))
    # 0.19: a persistent /goal lives per session id
    with failing_open(f"carrying the goal over to {child}", "the goal stays with the parent", level=logging.DEBUG,
                      advice=None):
        from hermes_cli.goals import migrate_goal_to_session

        migrate_goal_to_session(parent, child, reason="handoff")


def discard_session(db: Any, sid: str) -> None:
    """Remove a child that never went live (rollback of a failed hand-off)."""
    db.delete_session(sid)


# Turn leases a hand-off took for its child, per agent (id): released when that agent's turn ends.
_carried_leases: dict[int, list[tuple[Any, str, str]]] = {}


def carry_turn_lease(db: Any, agent: Any, child: str, *, given_back: bool = True) -> Callable[[], None] | None:
    """Hermes 0.20+ fences every transcript write of a turn with the turn's lease on its
    conversation, keyed by the lineage root through *compression* parents only: a hand-off
    child (its parent ended ``handoff``) is a conversation of its own. The turn that hands
    off takes the child's lease under its own holder, so its answer is written there;
    :func:`release_carried_turn_leases` gives it back when the turn ends (Hermes releases
    the lease it took, the parent's). ``None`` where no turn holds a lease (an earlier
    release, or a compression outside a turn). Raises when another holder has the child's, and
    when nothing will give it back at the turn's end (``given_back`` false: the seam that does,
    ``turn_history``, is not patched on this install), since the child's next turns would then
    wait until the lease expired."""
    holder = getattr(agent, "_active_session_turn_lease_holder", None)
    acquire = getattr(db, "try_acquire_session_turn_lease", None)
    if not holder or acquire is None:
        return None
    if not given_back:
        raise RuntimeError(f"nothing gives the turn lease of the new session {child} back when this turn ends "
                           "(seam turn_history not patched on this install)")
    ttl = float(getattr(agent, "_active_session_turn_lease_ttl_seconds", None) or 300.0)
    if not acquire(child, holder, ttl_seconds=ttl):
        raise RuntimeError(f"another holder has the turn lease of the new session {child}")
    carried = _carried_leases.setdefault(id(agent), [])
    entry = (db, child, str(holder))
    carried.append(entry)

    def undo() -> None:
        if entry in carried:
            carried.remove(entry)
        db.release_session_turn_lease(child, holder)

    return undo


def release_carried_turn_leases(agent: Any) -> None:
    """Give back the child leases a hand-off took during ``agent``'s turn (see
    :func:`carry_turn_lease`); nothing when it took none."""
    for db, child, holder in _carried_leases.pop(id(agent), []):
        db.release_session_turn_lease(child, holder)


def switch_agent_session(agent: Any, child: str, seeded: list[Any]) -> Callable[[], None]:
    """Move the agent to ``child`` everywhere the host keeps the live id (agent,
    ``HERMES_SESSION_ID``, the gateway/tools ContextVar, the log tag, the session
    log file) and re-base the flush bookkeeping on ``seeded`` (already stored).
    Returns an undo callable."""
    before = {name: getattr(agent, name) for name in _IDENTITY_ATTRS if hasattr(agent, name)}
    env_before = os.environ.get("HERMES_SESSION_ID")
    token = None
    ctx_before: Any = None
    log_ctx: Any = None
    try:
        import hermes_logging

        log_ctx = hermes_logging._session_context
        ctx_before = getattr(log_ctx, "session_id", None)
    except (ImportError, AttributeError) as exc:
        log.debug("session guard: Hermes's log context is unavailable (%s: %s)", type(exc).__name__, exc)
        log_ctx = None

    def undo() -> None:
        for name, value in before.items():
            setattr(agent, name, value)
        if env_before is None:
            os.environ.pop("HERMES_SESSION_ID", None)
        else:
            os.environ["HERMES_SESSION_ID"] = env_before
        if token is not None:
            try:
                token.var.reset(token)
            except (ValueError, RuntimeError) as exc:  # a token of another context
                log.debug("session guard: restoring the session ContextVar failed (%s: %s)", type(exc).__name__, exc)
        if log_ctx is not None:
            log_ctx.session_id = ctx_before

    try:
        agent.session_id = child
        os.environ["HERMES_SESSION_ID"] = child
        try:
            from gateway.session_context import _SESSION_ID

            token = _SESSION_ID.set(child)
        except (ImportError, AttributeError) as exc:  # hosts without the gateway's session ContextVar
            log.debug("session guard: gateway.session_context._SESSION_ID unavailable (%s: %s)",
                      type(exc).__name__, exc)
            token = None
        if log_ctx is not None:
            import hermes_logging

            hermes_logging.set_session_context(child)
        logs_dir = getattr(agent, "logs_dir", None)
        if logs_dir is not None and hasattr(agent, "session_log_file"):
            agent.session_log_file = Path(logs_dir) / f"session_{child}.json"
        agent._session_db_created = True
        rebase_flush(agent, child, seeded, "identity")
    except BaseException:
        undo()
        raise
    return undo


_IDENTITY_ATTRS = (
    "session_id", "session_log_file", "_session_db_created", "_last_flushed_db_idx", "_flushed_db_message_ids",
    "_flushed_db_message_session_id",
)


def notify_handoff(agent: Any, child: str, parent: str) -> None:
    """Tell the context engine and memory providers the conversation moved to ``child``."""
    notify_boundary(agent, child, parent, reason="handoff")
