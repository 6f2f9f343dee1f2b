"""Per-session figures for ``status``: how close each session is to compressing, and
how its compressions went. Read-only: state.db through a ``mode=ro`` connection,
the guard's audit log, the home's config.yaml.

- Pressure: the live transcript's estimated tokens (Hermes's own rough estimate,
  ~4 characters a token, where the release has it) against the agent's compression
  threshold and the gateway's session hygiene threshold, both in tokens from the
  main model's window and the release's rules (:mod:`config_findings`).
- History: compressions done / failed / skipped / adopted from the audit log, the
  causes of the failed and skipped ones, the last and the p95 duration of the done
  ones (``duration_ms`` of ``compression.done``).
- Snapshots with their message count and stored size, buffered messages, and the
  lock holder with its liveness.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import audit, host
from ..fail_open import failing_open
from ..host import facts
from ..host.rules import HostRules, load_host_rules
from .config_findings import config_section, main_model, merge_defaults, option_float, read_config
from .state_inspection import HomeState, readonly_connection

OUTCOMES = ("done", "skipped", "failed")
EXTRA_OUTCOMES = ("adopted",)


@dataclass
class Thresholds:
    model: str | None
    context_length: int | None
    context_source: str
    agent_percent: float | None
    agent_tokens: int | None
    hygiene_percent: float | None
    hygiene_tokens: int | None
    hermes_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def thresholds_for(home: Path, rules: HostRules | None = None) -> Thresholds:
    """The agent and hygiene thresholds in tokens for the home's main model (None where unknown)."""
    rules = rules if rules is not None else load_host_rules()
    try:
        raw = read_config(home)
    except (OSError, ValueError):
        raw = {}
    if rules is None:
        return Thresholds(None, None, "hermes-agent not importable", None, None, None, None)
    cfg = merge_defaults(rules.defaults, raw)
    providers: list[dict[str, Any]] = []
    if rules.custom_providers is not None:
        with failing_open("Hermes's custom providers", "the thresholds are worked out without custom providers",
                          advice=None, level=logging.DEBUG):
            providers = rules.custom_providers(cfg)
    main = main_model(cfg, rules, providers)
    percent = option_float(config_section(cfg, "compression").get("threshold"), 0.5)  # as check_config reads it
    if not main.context_length:
        return Thresholds(main.model or None, None, main.source, percent, None, rules.hygiene_percent, None,
                          rules.version)
    ctx = main.context_length
    return Thresholds(main.model or None, ctx, main.source, rules.effective_percent(ctx, percent),
                      rules.threshold(ctx, percent), rules.hygiene_percent, int(ctx * rules.hygiene_percent),
                      rules.version)


def live_tokens(db_path: Path, session_ids: list[str]) -> dict[str, int]:
    """Estimated tokens of each session's live transcript (what Hermes would load)."""
    estimate = facts.token_estimator()
    out: dict[str, int] = {}
    with readonly_connection(db_path) as conn:
        for sid in session_ids:
            messages = []
            for row in host.read_session_rows(conn, sid):
                if not host.is_live_row(row):
                    continue
                message = {"role": row.get("role"), "content": row.get("content") or ""}
                if row.get("tool_calls"):
                    message["tool_calls"] = row["tool_calls"]
                messages.append(message)
            out[sid] = int(estimate(messages))
    return out


def snapshot_sizes(db_path: Path) -> dict[str, dict[str, int]]:
    """Per session: snapshots, messages they hold, bytes of stored text (0s when the guard never wrote)."""
    out: dict[str, dict[str, int]] = {}
    with readonly_connection(db_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "session_guard_snapshots" not in tables:
            return out
        for sid, n, msgs in conn.execute(
            "SELECT session_id, COUNT(*), SUM(message_count) FROM session_guard_snapshots GROUP BY session_id"
        ):
            out[str(sid)] = {"count": int(n), "messages": int(msgs or 0), "bytes": 0}
        if "session_guard_snapshot_messages" in tables:
            for sid, size in conn.execute(
                "SELECT s.session_id, SUM(LENGTH(CAST(COALESCE(m.content, '') AS BLOB)) "
                "+ LENGTH(CAST(m.message_json AS BLOB))) FROM session_guard_snapshot_messages m "
                "JOIN session_guard_snapshots s ON s.snapshot_id = m.snapshot_id GROUP BY s.session_id"
            ):
                out.setdefault(str(sid), {"count": 0, "messages": 0, "bytes": 0})["bytes"] = int(size or 0)
    return out


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class CompressionHistory:
    counts: Counter[str] = field(default_factory=Counter)
    causes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    durations_ms: list[float] = field(default_factory=list)  # of done compressions, in log order
    last_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: self.counts.get(k, 0) for k in (*OUTCOMES, *EXTRA_OUTCOMES)},
            "causes": {k: dict(v) for k, v in self.causes.items() if v},
            "last_duration_ms": self.durations_ms[-1] if self.durations_ms else None,
            "p95_duration_ms": p95(self.durations_ms),
            "last_at": self.last_at,
        }


def compression_history(audit_path: Path) -> dict[str, CompressionHistory]:
    out: dict[str, CompressionHistory] = defaultdict(CompressionHistory)
    for event in audit.read_events(audit_path):
        name = str(event.get("event", ""))
        if not name.startswith("compression.") or not event.get("session_id"):
            continue
        outcome = name.split(".", 1)[1]
        if outcome not in OUTCOMES and outcome not in EXTRA_OUTCOMES:
            continue
        h = out[str(event["session_id"])]
        h.counts[outcome] += 1
        h.last_at = str(event.get("ts") or h.last_at)
        if outcome in ("failed", "skipped"):
            h.causes[outcome][_cause(event.get("reason"))] += 1
        if outcome == "done" and isinstance(event.get("duration_ms"), int | float):
            h.durations_ms.append(float(event["duration_ms"]))
    return out


def _cause(reason: Any) -> str:
    """A reason as a short cause (the first clause; ids and counts stay, user text never reaches the audit)."""
    text = " ".join(str(reason or "no reason recorded").split())
    return text if len(text) <= 160 else text[:157] + "..."


def _pct(tokens: int, limit: int | None) -> float | None:
    return round(100.0 * tokens / limit, 1) if limit else None


def build_sessions(state: HomeState, session_ids: list[str] | None = None) -> tuple[Thresholds, list[dict[str, Any]]]:
    """The per-session report, most pressed first."""
    history = compression_history(audit.audit_file(state.home, state.config.audit.path))
    sizes = snapshot_sizes(state.db_path) if state.has_db else {}
    locks: dict[str, list[Any]] = defaultdict(list)
    for lk in state.locks:
        locks[lk.session_id].append(lk)
    if session_ids is None:
        live_ids = {sid for sid, info in state.sessions.items() if not info.ended and info.live_rows}
        ids = sorted(live_ids | set(history) | set(state.snapshots) | set(state.buffered) | set(locks))
    else:
        ids = list(session_ids)
    thresholds = thresholds_for(state.home)
    try:
        tokens = live_tokens(state.db_path, [sid for sid in ids if sid in state.sessions]) if state.has_db else {}
    except sqlite3.Error:
        tokens = {}
    rows: list[dict[str, Any]] = []
    for sid in ids:
        info = state.sessions.get(sid)
        h = history.get(sid, CompressionHistory())
        est = tokens.get(sid, 0)
        size = sizes.get(sid, {"count": state.snapshots.get(sid, 0), "messages": 0, "bytes": 0})
        rows.append({
            "session_id": sid,
            "exists": info is not None,
            "ended": bool(info and info.ended),
            "end_reason": info.end_reason if info else None,
            "source": info.source if info else None,
            "live_messages": info.live_rows if info else 0,
            "estimated_tokens": est,
            "agent_threshold_percent": _pct(est, thresholds.agent_tokens),
            "hygiene_threshold_percent": _pct(est, thresholds.hygiene_tokens),
            "compressions": {k: h.counts.get(k, 0) for k in OUTCOMES},
            "compression_history": h.as_dict(),
            "snapshots": state.snapshots.get(sid, size["count"]),
            "snapshot_messages": size["messages"],
            "snapshot_bytes": size["bytes"],
            "buffered": state.buffered.get(sid, 0),
            "lock_holders": [{
                "kind": lk.kind, "holder": lk.holder, "liveness": lk.holder_liveness(),
                "expires_in_seconds": round(lk.expires_at - state.now, 1) if lk.expires_at else None,
                "expired": lk.expired(state.now),
            } for lk in locks.get(sid, [])],
        })
    rows.sort(key=lambda r: (-(r["agent_threshold_percent"] or -1.0), -r["estimated_tokens"], r["session_id"]))
    return thresholds, rows
