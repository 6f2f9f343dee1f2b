"""Drive the real Hermes offline: a temporary home, a seeded session, one compression.

Used by ``selftest`` (in a subprocess with its own ``HERMES_HOME``) and by the
integration tests. Nothing here imports Hermes at module import time:
``HERMES_HOME`` must be set before the first Hermes import.

Why one module: the probe is one scenario (seed, compress, verify) whose
checks share one context object; the gateway side lives in :mod:`.gateway`, the seeded
conversation both start from in :mod:`.seeds` (the probe re-exports it).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..file_modes import make_private_dirs, write_private_text
from ..store.connection import connect
from .seeds import MESSAGE_CHARS as MESSAGE_CHARS
from .seeds import SEED_MESSAGES as SEED_MESSAGES
from .seeds import seed_messages as seed_messages


def write_config(
    home: Path,
    base_url: str,
    *,
    plugin_enabled: bool = True,
    in_place: bool | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A config.yaml pointing Hermes at the fake LLM (and enabling the guard)."""
    import yaml

    make_private_dirs(home)
    cfg: dict[str, Any] = {
        "model": {
            "default": "fake-model",
            "provider": "custom",
            "base_url": base_url,
            "api_key": "sk-fake",
            "context_length": 128000,
        },
        "plugins": {"enabled": ["session-guard"] if plugin_enabled else []},
    }
    if in_place is not None:
        cfg["compression"] = {"in_place": in_place}
    if extra:
        cfg.update(extra)
    path = home / "config.yaml"
    write_private_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def discover_guard() -> Any:
    """Run Hermes's own plugin discovery (as the CLI and gateway do)."""
    from hermes_cli import plugins

    plugins.discover_plugins()
    return plugins.get_plugin_manager()


def open_db(path: Path) -> Any:
    from hermes_state import SessionDB

    return SessionDB(db_path=Path(path))


def make_agent(db: Any, base_url: str, session_id: str, *, platform: str = "cli", **kwargs: Any) -> Any:
    from run_agent import AIAgent

    params: dict[str, Any] = dict(
        base_url=base_url,
        api_key="sk-fake",
        provider="custom",
        model="fake-model",
        quiet_mode=True,
        skip_context_files=True,
        skip_memory=True,
        enabled_toolsets=[],
        session_db=db,
        platform=platform,
        session_id=session_id,
    )
    params.update(kwargs)
    return AIAgent(**params)


def seed_session(db: Any, session_id: str, messages: list[dict[str, Any]], source: str = "cli") -> None:
    db.create_session(session_id=session_id, source=source, model="fake-model")
    for m in messages:
        db.append_message(session_id=session_id, role=m["role"], content=m["content"])


def mark_flushed(agent: Any, messages: list[dict[str, Any]]) -> None:
    """Tell the agent these messages are already in state.db (as after a resumed turn)."""
    agent._session_db_created = True
    agent._last_flushed_db_idx = len(messages)
    if hasattr(agent, "_flushed_db_message_ids"):
        agent._flushed_db_message_ids = {id(m) for m in messages}
        agent._flushed_db_message_session_id = agent.session_id


class _RecordCapture(logging.Handler):
    """Keeps every record it is handed (thread-safe: ``Handler.handle`` calls ``emit`` under the handler's lock)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def root_log_records() -> Iterator[list[logging.LogRecord]]:
    """Every record the root logger handles meanwhile (its level lowered to INFO at most),
    in a list that stays filled once the block ends."""
    cap = _RecordCapture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(cap)
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    try:
        yield cap.records
    finally:
        root.removeHandler(cap)
        root.setLevel(old_level)


def session_tag(record: logging.LogRecord) -> str:
    """The ``[session]`` tag Hermes's log record factory put on ``record`` ("" without one)."""
    return str(getattr(record, "session_tag", "") or "").strip()


@contextmanager
def capture_host_compression_logs() -> Iterator[list[str]]:
    """Capture Hermes's own ``context compression started/done`` lines, rendered with
    the ``[session]`` tag Hermes's record factory put on them (as in agent.log)."""
    lines: list[str] = []
    with root_log_records() as records:
        try:
            yield lines
        finally:
            for rec in records:
                msg = rec.getMessage()
                if "context compression" in msg:
                    tag = session_tag(rec)
                    lines.append(f"{tag} {msg}" if tag else msg)


def session_ids_in(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for token in line.split():
            if token.startswith("session="):
                out.append(token.split("=", 1)[1])
    return out


def sessions_table(db_path: Path) -> list[dict[str, Any]]:
    with closing(connect(db_path)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM sessions ORDER BY started_at")]


def live_messages(db_path: Path, session_id: str) -> list[dict[str, Any]]:
    """Messages Hermes would load for ``session_id`` (active rows where the host has them)."""
    with closing(connect(db_path)) as conn:
        return [r for r in host.read_session_rows(conn, session_id) if host.is_live_row(r)]


@dataclass
class ProbeResult:
    checks: list[dict[str, Any]] = field(default_factory=list)
    seams: list[dict[str, Any]] = field(default_factory=list)
    host_version: str | None = None
    host_in_table: bool = True
    compat_note: str = ""
    trial: dict[str, Any] = field(default_factory=dict)  # a release outside the table: see trial_payload

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "state": "pass" if ok else "fail", "detail": detail})
        return bool(ok)

    @property
    def ok(self) -> bool:
        return any(c["state"] == "pass" for c in self.checks) and all(c["ok"] for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "host_version": self.host_version, "host_in_table": self.host_in_table,
                "compat_note": self.compat_note, "seams": self.seams, "checks": self.checks, **self.trial}


def import_display_modules(runtime: Any) -> list[str]:
    """Import the modules whose rows wait for Hermes to import them (CLI, TUI, API
    server, platform adapters), so this probe process checks them against the
    installed host too. Only ever done in the probe's own throw-away process.
    A module Hermes itself cannot import here (a missing optional dependency, or
    code that needs a newer Python) is listed as ``module (error)``."""
    import importlib

    from ..seams.apply import apply_pending

    imported = []
    for status in list(runtime.seams):
        module = _row_module(runtime, status.name) if status.state == "pending" else None
        if module is None:
            continue
        with failing_open(f"importing {module}", "reported through the row's status", level=None) as failed:
            importlib.import_module(module)
            imported.append(module)
        if failed:
            imported.append(f"{module} ({failed.reason})")
    # apply_pending never blocks (it runs inside imports): the seams' own watcher thread may
    # hold the lock for a moment, so ask until nothing imported is left waiting.
    for _ in range(200):
        apply_pending()
        if not any(s.state == "pending" and (_row_module(runtime, s.name) or "") in sys.modules
                   for s in runtime.seams):
            break
        time.sleep(0.01)
    return imported


def _row_module(runtime: Any, seam: str) -> str | None:
    """The module of the row a seam is waiting on (its status names the row's target)."""
    status = next((s for s in runtime.seams if s.name == seam), None)
    target = status.target if status is not None else "-"
    return target.split(":", 1)[0] if ":" in target else None


PROBE_SESSION_ID = "20260528_093510_66bfaec7"


@dataclass
class ProbeContext:
    """What the live probe set up and observed; checks read it."""

    home: Path
    runtime: Any
    db_path: Path
    sid: str
    messages: list[dict[str, Any]]
    agent: Any = None
    compressed: list[Any] = field(default_factory=list)
    host_lines: list[str] = field(default_factory=list)
    env_before: str | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    llm: Any = None  # the probe's FakeLLMServer

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read state.db through a read-only connection ([] when the table is absent)."""
        conn = connect(self.db_path, read_only=True)
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()


@dataclass(frozen=True)
class ProbeCheck:
    """One part of the contract the live probe verifies. ``during_summary`` runs
    inside the host's summary call (the compression is in flight); ``verify``
    runs after it and records pass/fail/skip results on the ProbeResult."""

    name: str
    verify: Callable[[ProbeContext, ProbeResult], None]
    during_summary: Callable[[ProbeContext], None] | None = None


def verify_id_stable(ctx: ProbeContext, result: ProbeResult) -> None:
    sid, messages, compressed = ctx.sid, ctx.messages, ctx.compressed
    result.check("compression made progress", len(compressed) < len(messages), f"{len(messages)} -> {len(compressed)}")
    result.check("agent.session_id unchanged", ctx.agent.session_id == sid, ctx.agent.session_id)
    result.check("HERMES_SESSION_ID unchanged", os.environ.get("HERMES_SESSION_ID") == ctx.env_before,
                 str(os.environ.get("HERMES_SESSION_ID")))
    ids = session_ids_in(ctx.host_lines)
    result.check("host log lines started/done name the same id", len(ids) >= 2 and set(ids) == {sid},
                 " | ".join(ctx.host_lines))
    rows = sessions_table(ctx.db_path)
    result.check("no child session created", [r["id"] for r in rows] == [sid], ", ".join(r["id"] for r in rows))
    result.check("session not ended", rows[0]["ended_at"] is None if rows else False)
    live = live_messages(ctx.db_path, sid)
    result.check("live transcript is the compacted one", len(live) == len(compressed),
                 f"{len(live)} live rows, {len(compressed)} compacted")


def verify_snapshot(ctx: ProbeContext, result: ProbeResult) -> None:
    snaps = ctx.runtime.store_for(ctx.db_path).list_snapshots(ctx.sid)
    result.check(
        "pre-compression transcript kept as snapshot",
        len(snaps) == 1 and snaps[0].message_count == len(ctx.messages)
        and snaps[0].snapshot_id.startswith(f"{ctx.sid}.snapshot."),
        ", ".join(f"{s.snapshot_id} ({s.message_count})" for s in snaps),
    )


def verify_audit(ctx: ProbeContext, result: ProbeResult) -> None:
    from .. import audit

    events = [e for e in audit.read_events(ctx.runtime.audit_path) if e.get("op_id")]
    names = [e["event"] for e in events]
    result.check(
        "audit events name one session",
        "compression.started" in names and "compression.done" in names
        and {e["session_id"] for e in events} == {ctx.sid},
        ", ".join(names),
    )


def _lock_rows(ctx: ProbeContext) -> tuple[list[str], list[tuple[str, Any]]]:
    from ..maintenance.state_inspection import registered_lock_tables

    tables, rows = [], []
    for t in registered_lock_tables():
        if not ctx.query(f"SELECT name FROM sqlite_master WHERE type = 'table' AND name = '{t.table}'"):
            continue
        tables.append(t.table)
        rows += [(t.kind, r[0]) for r in ctx.query(
            f"SELECT {t.holder_column} FROM {t.table} WHERE {t.session_column} = ?", ctx.sid)]
    return tables, rows


def observe_locks(ctx: ProbeContext) -> None:
    ctx.observed["lock_tables"], ctx.observed["locks_during"] = _lock_rows(ctx)


def verify_lock(ctx: ProbeContext, result: ProbeResult) -> None:
    """The guard's compression lock was held while the summary ran (the guard's own
    lease table on 0.14, Hermes's ``compression_locks`` from 0.18.2, re-entered by
    the host) and nothing is left held afterwards, in the tables or in-process."""
    from .. import audit

    name = "compression lock taken and released"
    tables = ctx.observed.get("lock_tables")
    if tables is None:
        result.check(name, False, "the summary call was never observed")
        return
    done = next((e for e in audit.read_events(ctx.runtime.audit_path)
                 if e.get("event") == "compression.done" and e.get("session_id") == ctx.sid), {})
    lock, holder = done.get("lock"), done.get("lock_holder")
    during = ctx.observed.get("locks_during") or []
    _, after = _lock_rows(ctx)
    in_process = ctx.runtime.locks_for(ctx.db_path).held_sessions()
    if lock == "host":  # native mode (0.20+): Hermes took and released its own lock, the guard none
        held = any(table == "native" for table, _ in during)
    else:
        held = lock in ("guard", "native") and bool(holder) and (lock, holder) in during
    result.check(
        name,
        bool(tables) and held and not after and not in_process,
        f"lock tables: {', '.join(tables) or 'none'}; audit: lock={lock} holder={holder}; "
        f"during the summary call: {during or 'none'}; after: {after or 'none'}; "
        f"held in-process: {in_process or 'none'}",
    )


def verify_doctor_clean(ctx: ProbeContext, result: ProbeResult) -> None:
    from ..maintenance.corruption import diagnose
    from ..maintenance.state_inspection import load_home_state

    _, findings = diagnose(load_home_state(ctx.home))
    result.check("doctor finds no corruption afterwards", not findings,
                 "; ".join(f"{f.signature}: {f.detail}" for f in findings))


def summary_tag_check(result: ProbeResult, llm: Any, agent: Any, compressed: list[Any], sid: str) -> bool:
    """The compaction summary carries ``is_compressed_summary`` and the recall line, and the
    next request to a strict provider (400 on unknown message keys) carries the summary
    text but not the key."""
    from ..summaries.tags import is_summary_text

    summaries = [m for m in compressed if isinstance(m, dict) and is_summary_text(str(m.get("content")))]
    tagged = len(summaries) == 1 and summaries[0].get("is_compressed_summary") is True
    header = bool(summaries) and f"[Original context: session {sid}, turns " in str(summaries[0].get("content"))
    llm.reset()
    llm.configure(strict=True, reply_text="probe ok")
    # a 400 surfaces as an error result or an exception, depending on the host
    with failing_open("the strict provider's turn", "reported as its error", level=None) as failed:
        reply = agent.run_conversation("probe: one more question", conversation_history=compressed)
        answered = reply.get("final_response") == "probe ok"
    if failed:
        answered, reply = False, {"error": failed.reason}
    # The turn's own request (a host may make side requests after it: a title, a review)
    chats = [c for c in llm.chat_requests()
             if any(isinstance(m, dict) and m.get("content") == "probe: one more question"
                    for m in c.body.get("messages", []))]
    sent: list[Any] = max((c.body.get("messages", []) for c in chats), key=len, default=[])  # a title request is short
    carried = any(is_summary_text(str(m.get("content"))) for m in sent)
    clean = not llm.violations and not any("is_compressed_summary" in m for m in sent if isinstance(m, dict))
    return result.check(
        "summary tagged and stripped from the request",
        tagged and header and answered and carried and clean,
        f"tagged={tagged} recall_line={header} strict_reply={answered} summary_sent={carried} "
        f"violations={llm.violations} error={reply.get('error')}",
    )


def verify_summary_tag(ctx: ProbeContext, result: ProbeResult) -> None:
    summary_tag_check(result, ctx.llm, ctx.agent, ctx.compressed, ctx.sid)


def verify_buffered_delivery(ctx: ProbeContext, result: ProbeResult) -> None:
    """Through the real GatewayRunner, a message that arrives while its session
    compresses is buffered and answered after the one that triggered the compression."""
    from .gateway import check_buffered_delivery

    ctx.llm.reset()  # the default replies and summaries, without the probe's summary observers
    check_buffered_delivery(result, ctx.llm, ctx.runtime)


# The contract checks of the live probe, in order. A new guarantee is one entry here.
PROBE_CHECKS: list[ProbeCheck] = [
    ProbeCheck("id stable across compression", verify_id_stable),
    ProbeCheck("snapshot", verify_snapshot),
    ProbeCheck("audit", verify_audit),
    ProbeCheck("lock", verify_lock, during_summary=observe_locks),
    ProbeCheck("doctor", verify_doctor_clean),
    # Runs a further turn against a strict provider, so it comes after the state checks.
    ProbeCheck("summary tagged and stripped", verify_summary_tag),
    # Its own gateway session in the same HERMES_HOME, after the checks on the probe session.
    ProbeCheck("buffered delivery", verify_buffered_delivery),
]


def run_contract_probe(home: Path) -> ProbeResult:
    """The live probe: enable the guard through config.yaml, let Hermes discover it,
    compress a 48-message session once and run the contract checks. ``HERMES_HOME``
    must already point at ``home``."""
    from ..runtime import current_runtime
    from .fake_llm import DEFAULT_SUMMARY_TEXT, FakeLLMServer

    result = ProbeResult()
    with FakeLLMServer() as llm:
        write_config(home, llm.base_url, in_place=False)
        discover_guard()
        runtime = current_runtime()
        result.check("guard loaded by Hermes plugin discovery", runtime is not None)
        if runtime is None:
            return result
        result.host_version = runtime.host_version
        waiting = import_display_modules(runtime)
        result.host_in_table = runtime.host_in_table
        result.compat_note = runtime.compat_note
        result.seams = [s.as_dict() for s in runtime.seams]
        result.check(
            "compression seam patched",
            any(s.name == "compression" and s.state == "patched" for s in runtime.seams),
            "; ".join(f"{s.name}: {s.state} {s.reason}" for s in runtime.seams),
        )
        # A row still waiting on a module Hermes itself cannot import here reaches nothing:
        # no entry point of this environment runs that code (said in the detail, not a failure).
        broken = {w.split(" (", 1)[0]: w for w in waiting if " (" in w}
        unreachable = [s for s in runtime.seams if s.state == "pending" and _row_module(runtime, s.name) in broken]
        # on a release outside the table, seams left off until selftest verifies them are reported per promise
        left_off = [s for s in runtime.seams if s.name in runtime.unverified_seams]
        result.check(
            "summary and display seams patched",
            all(s.state in ("patched", "not-needed") or s in unreachable or s in left_off for s in runtime.seams),
            "; ".join(f"{s.name}: {s.state} {s.reason}" for s in runtime.seams
                      if s.state not in ("patched", "not-needed") and s not in unreachable and s not in left_off)
            or "; ".join(f"{s.name}: not reachable, Hermes cannot import {broken[_row_module(runtime, s.name) or '']}"
                         for s in unreachable)
            or ", ".join(waiting),
        )
        db_path = home / "state.db"
        db = open_db(db_path)
        ctx = ProbeContext(home=home, runtime=runtime, db_path=db_path, sid=PROBE_SESSION_ID,
                           messages=seed_messages(), llm=llm)
        seed_session(db, ctx.sid, ctx.messages)
        ctx.agent = make_agent(db, llm.base_url, ctx.sid)
        mark_flushed(ctx.agent, ctx.messages)
        ctx.env_before = os.environ.get("HERMES_SESSION_ID")

        def summary(_body: dict[str, Any]) -> str:
            for check in PROBE_CHECKS:
                if check.during_summary is not None:
                    check.during_summary(ctx)
            return DEFAULT_SUMMARY_TEXT

        llm.configure(summary_fn=summary)
        with capture_host_compression_logs() as lines:
            ctx.compressed, _ = ctx.agent._compress_context(ctx.messages, "You are a test agent.",
                                                            approx_tokens=150_000)
        ctx.host_lines = lines
        for check in PROBE_CHECKS:
            start = len(result.checks)
            # one broken check must not hide the others
            with failing_open(f"check {check.name!r}", "reported as failed", level=None) as failed:
                check.verify(ctx, result)
            if failed:
                result.check(check.name, False, failed.reason)
            for entry in result.checks[start:]:
                entry["part"] = check.name  # the promise it verifies (seams.verification.PROMISES)
        result.seams = [s.as_dict() for s in runtime.seams]  # as they stand after the checks imported modules
        trial_payload(runtime, result)
    return result


def trial_payload(runtime: Any, result: ProbeResult) -> None:
    """On a release outside the table (a trial for selftest): the code fingerprint and the
    capabilities, so that selftest can record what this process verified."""
    from ..seams import verification

    plan = runtime.verification
    if isinstance(plan, verification.Plan) and plan.mode == verification.TRIAL and runtime.host_version:
        result.trial = {"fingerprint": verification.fingerprint(runtime.host_version),
                        "capabilities": plan.caps().describe()}


def main() -> int:
    """Entry for ``python -m hermes_session_guard.selftest.probe`` (run by ``selftest``)."""
    out = sys.stdout  # imported host modules may re-point sys.stdout (the TUI gateway sends it to stderr)
    home = Path(os.environ["HERMES_HOME"])
    with failing_open("the contract probe", "reported in its payload", level=None) as failed:
        result = run_contract_probe(home)
        payload = result.as_dict()
    if failed.exc is not None:  # report, don't traceback: selftest prints it
        import traceback

        payload = {"ok": False, "error": failed.reason, "traceback": "".join(traceback.format_exception(failed.exc)),
                   "checks": [], "seams": []}
    print("\nSESSION_GUARD_PROBE " + json.dumps(payload), file=out, flush=True)
    return 0 if payload.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
