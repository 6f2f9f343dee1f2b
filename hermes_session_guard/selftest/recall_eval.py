"""The recall eval: compact the fixture conversation with the real host, then ask for
every planted specific the way a model would, through Hermes's own tool dispatch.

Used by ``scripts/eval_recall.py`` and the host tests. ``HERMES_HOME`` must already
point at a throw-away home whose config.yaml enables the guard (see
:func:`write_eval_config`); nothing here imports Hermes at module import time.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fail_open import failing_open
from . import probe

FIXTURE = Path(__file__).resolve().parent / "data" / "recall_conversation.json"  # package data: ships in the wheel
SESSION_ID = "20241118_065800_1ed9e7"
SYSTEM = "You are Hermes, helping with a production incident."
TARGET = 0.98


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return fixture


def write_eval_config(home: Path, base_url: str, fixture: dict[str, Any]) -> None:
    """A config.yaml with the fixture's compression settings (a 64K-token model with a
    10 % tail keeps the long later pastes and compacts the planted turns)."""
    comp = fixture.get("compression", {})
    probe.write_config(home, base_url, extra={
        "model": {"default": "fake-model", "provider": "custom", "base_url": base_url, "api_key": "sk-fake",
                  "context_length": int(comp.get("context_length", 64000))},
        "compression": {"target_ratio": float(comp.get("target_ratio", 0.1))},
    })


@dataclass
class EvalResult:
    host_version: str | None
    compacted: tuple[int, int] | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.rows)

    @property
    def hits(self) -> int:
        return sum(1 for r in self.rows if r["hit"])

    @property
    def score(self) -> float:
        return self.hits / self.total if self.total else 0.0

    def top(self, k: int) -> float:
        """Share of queries whose planted string is in one of the first ``k`` passages."""
        return sum(1 for r in self.rows if r["rank"] and r["rank"] <= k) / self.total if self.total else 0.0

    @property
    def outside(self) -> list[dict[str, Any]]:
        """Planted items the host did not compact (a longer tail kept live, as on 0.22.2)."""
        return [r for r in self.rows if not r["compacted"]]


def verdict(result: EvalResult, target: float = TARGET) -> tuple[bool, str]:
    """``(passed, why)``: recall over every planted item and over the ones the host compacted
    at least ``target``, and the host compacted at least one (so recall of compacted turns was
    measured at all). Planted turns a host leaves outside its compacted span (0.22.2 keeps a
    longer tail) are reported, not counted against it."""
    rows = result.rows
    inside = [r for r in rows if r["compacted"]]
    if not rows:
        return False, "nothing planted"
    if not inside:
        return False, "the host compacted none of the planted turns: recall of compacted turns was not measured"
    score = sum(1 for r in rows if r["hit"]) / len(rows)
    inside_score = sum(1 for r in inside if r["hit"]) / len(inside)
    if score < target or inside_score < target:
        return False, f"recall {score:.1%}, {inside_score:.1%} of the compacted ones (target {target:.0%})"
    outside = len(rows) - len(inside)
    return True, (f"{len(inside)} compacted planted turns recalled at {inside_score:.1%}"
                  + (f"; {outside} left outside the host's compacted span, recalled too" if outside else ""))


def _header_range(messages: list[Any]) -> tuple[int, int] | None:
    import re

    for m in messages:
        found = re.search(r"\[Original context: session \S+, turns (\d+)–(\d+), snapshot \S+\]",
                          str(m.get("content")))
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def _rank(answer: str, text: str) -> int | None:
    """1-based position of the first passage of ``answer`` that holds ``text``."""
    for i, passage in enumerate(answer.split("\n--- turn ")[1:], 1):
        if text in passage:
            return i
    return None


def run_recall_eval(home: Path, base_url: str, fixture: dict[str, Any] | None = None) -> EvalResult:
    """Seed, compact with the installed Hermes (guarded), then recall every planted item."""
    import run_agent

    from ..runtime import current_runtime

    fixture = fixture or load_fixture()
    messages = [dict(m) for m in fixture["messages"]]
    db = probe.open_db(home / "state.db")
    try:
        probe.seed_session(db, SESSION_ID, messages)
        agent = probe.make_agent(db, base_url, SESSION_ID, enabled_toolsets=["session_guard"])
        if hasattr(agent, "compression_in_place"):
            agent.compression_in_place = True
        probe.mark_flushed(agent, messages)
        compressed, _ = agent._compress_context(messages, SYSTEM, approx_tokens=150_000)
        span = _header_range(compressed)
        live = json.dumps(compressed, ensure_ascii=False)
        runtime = current_runtime()
        # Hermes's tool dispatch: run_agent's name up to 0.20, model_tools's from 0.21 (the
        # tool_session seam's target; run_agent no longer re-exports it).
        dispatch = getattr(run_agent, "handle_function_call", None)
        if dispatch is None:
            import model_tools

            dispatch = model_tools.handle_function_call
        result = EvalResult(host_version=runtime.host_version if runtime else None, compacted=span)
        for item in fixture["planted"]:
            started = time.perf_counter()
            answer = dispatch(
                "session_guard_recall", {"query": item["query"]}, "recall-eval", session_id=SESSION_ID,
            )
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            compacted = span is not None and span[0] <= item["turn"] <= span[1] and item["text"] not in live
            result.rows.append({
                "id": item["id"], "kind": item["kind"], "query": item["query"], "text": item["text"],
                "turn": item["turn"], "compacted": compacted, "hit": item["text"] in answer,
                "rank": _rank(answer, item["text"]), "answer_chars": len(answer),
            })
        return result
    finally:
        with failing_open("closing the recall evaluation's state.db", "the connection is left to be collected",
                          advice=None, level=logging.DEBUG):
            db.close()
