#!/usr/bin/env python3
"""Thirteen agent processes crossing the compression threshold in one window, guarded
vs unguarded, side by side in one run.

    python scripts/bench_processes.py [--processes 13] [--shared 3] [--latency 1.0]
                                      [--rounds 1] [--mode default|in_place|rotate]

Each process is ``tests/integration/compression_driver.py``: it resumes its session
from its ``HERMES_HOME`` (Hermes's own plugin discovery loads the guard when the
home's config enables it), signals ready, waits for one shared go file, then runs
one turn whose preflight crosses the compression threshold. ``--processes - --shared``
processes have a home and a session each; the last ``--shared`` share one home and
one session (a gateway, a CLI and a cron job resuming one conversation). The fake
LLM (served by this process) answers every model call (chat completions, the
summary included) after ``--latency`` seconds; the endpoint probes Hermes makes
to learn the server type and context length are answered at once.

Per arm (unguarded: plugin disabled; guarded: enabled), in alternating order:

* one compression: a single process alone, from the go signal to the end of its turn;
* all processes: from the go signal until the last one finished, and the ratio to one;
* the crossing window (first to last process starting its turn);
* ids kept (a process that ends its turn on the session id it started with);
* conversations left with exactly one live session (no fork), summary calls made;
* seed messages lost: of each conversation's 48 seeded messages, those found neither
  in any message row of its state.db nor in a guard snapshot;
* turns lost / doubled: processes whose question or answer is missing from, or
  live more than once in, the transcript of the session they ended on.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hermes_session_guard.selftest import probe  # noqa: E402
from tests.integration.process_fleet import (  # noqa: E402
    SHARED_SID,
    FleetFailed,
    marker_answer,
    plan_for,
    run_fleet,
    seed_homes,
    seed_tags,
)


def _slow(latency: float) -> Callable[[dict[str, Any]], str]:
    """The reply function: ``latency`` seconds of model time, then :func:`marker_answer`
    (the fake serves each request on its own thread)."""

    def reply(body: dict[str, Any]) -> str:
        time.sleep(latency)
        return marker_answer(body)

    return reply


def _all_texts(db_path: Path) -> str:
    """Every message row and every guard snapshot message of a state.db, as one text."""
    conn = sqlite3.connect(str(db_path))
    try:
        texts = [str(r[0]) for r in conn.execute("SELECT content FROM messages")]
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'session_guard_snapshot_messages'").fetchone():
            texts += [str(r[0]) for r in conn.execute("SELECT content FROM session_guard_snapshot_messages")]
    finally:
        conn.close()
    return "\n".join(texts)


def run_arm(root: Path, llm: Any, *, guarded: bool, processes: int, shared: int, mode: str) -> dict[str, Any]:
    llm.reset()  # the constructor's latency and reply function, no recorded requests
    root.mkdir(parents=True)
    plan = plan_for(root, processes - shared, shared)
    seed_tag = seed_tags(plan)
    in_place = {"default": None, "in_place": True, "rotate": False}[mode]
    seed_homes(plan, llm.base_url, in_place=in_place, plugin_enabled=guarded)
    try:
        reports, _, go_at = run_fleet(root, plan, llm.base_url, in_place=in_place, timeout=600, driver_timeout=600)
    except FleetFailed as exc:
        raise SystemExit(str(exc)) from None
    errors = [r["traceback"] for r in reports if "error" in r]
    if errors:
        raise SystemExit("a process failed:\n" + errors[0])

    lost = kept_one = 0
    turns_lost = turns_doubled = 0
    for home, sid in sorted({(h, s) for h, s, _ in plan}):
        rows = probe.sessions_table(home / "state.db")
        kept_one += sum(1 for r in rows if r["ended_at"] is None) == 1
        everything = _all_texts(home / "state.db")
        lost += sum(f"{seed_tag[sid]}-{i}:" not in everything for i in range(probe.SEED_MESSAGES))
    for (home, _sid, tag), r in zip(plan, reports, strict=True):
        live = [str(m["content"]) for m in probe.live_messages(home / "state.db", r["session_id_after"])]
        asked = sum(t.startswith(f"{tag}-next:") for t in live)
        answered = sum(t == f"{tag}-reply: answered" for t in live)
        turns_lost += min(asked, answered) == 0
        turns_doubled += max(asked, answered) > 1
    crossed = [r["crossed_at"] for r in reports]
    finished = [r["finished_at"] for r in reports]
    return {
        "total": max(finished) - go_at,
        "per_process": [f - c for f, c in zip(finished, crossed, strict=True)],
        "shared_flags": [sid == SHARED_SID for _, sid, _ in plan],
        "window": max(crossed) - min(crossed),
        "ids_kept": sum(r["session_id_after"] == sid for (_, sid, _), r in zip(plan, reports, strict=True)),
        "processes": len(plan),
        "conversations": len({s for _, s, _ in plan}),
        "one_live_session": kept_one,
        "summaries": len(llm.summary_requests()),
        "seed_lost": lost,
        "turns_lost": turns_lost,
        "turns_doubled": turns_doubled,
        "guard_loaded": sum(bool(r["guard_loaded"]) for r in reports),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=13)
    parser.add_argument("--shared", type=int, default=3, help="how many of them share one conversation")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per model call (summary included)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mode", choices=("default", "in_place", "rotate"), default="default",
                        help="compression.in_place in the homes' config (0.18.2+; default: Hermes's own)")
    args = parser.parse_args()
    os.environ.setdefault("HERMES_HOME", tempfile.mkdtemp(prefix="session-guard-procs-"))
    import logging

    logging.disable(logging.WARNING)
    from machine_info import describe, load_average

    from hermes_session_guard.selftest.fake_llm import FakeLLMServer
    from hermes_session_guard.selftest.probe import SEED_MESSAGES

    print(describe())
    print(f"{args.processes} processes ({args.processes - args.shared} own sessions + {args.shared} sharing one), "
          f"LLM latency {args.latency:g} s per model call, mode {args.mode}, {args.rounds} round(s)")
    results: dict[bool, list[tuple[dict[str, Any], dict[str, Any]]]] = {False: [], True: []}
    llm = FakeLLMServer(summary_latency=args.latency, reply_fn=_slow(args.latency))
    with llm, tempfile.TemporaryDirectory(prefix="session-guard-procs-") as tmp:
        for i in range(args.rounds):
            for guarded in ((False, True) if i % 2 == 0 else (True, False)):
                base = Path(tmp) / f"r{i}-{int(guarded)}"
                one = run_arm(base / "one", llm, guarded=guarded, processes=1, shared=0, mode=args.mode)
                many = run_arm(base / "many", llm, guarded=guarded, processes=args.processes, shared=args.shared,
                               mode=args.mode)
                results[guarded].append((one, many))
                print(f"  round {i + 1} {'guarded' if guarded else 'unguarded'}: one {one['total']:.2f} s, "
                      f"{many['processes']} processes {many['total']:.2f} s (load average {load_average()})",
                      flush=True)
    print(f"\nmedians over {args.rounds} round(s); counts summed over the rounds")
    print(f"{'':10} {'one s':>6} {'all s':>6} {'all/one':>7} {'window s':>8} {'ids kept':>9} "
          f"{'1 live session':>14} {'summaries':>9} {'seed lost':>9} {'turns lost/doubled':>18} {'guard':>7}")
    for guarded in (False, True):
        runs = results[guarded]
        one = statistics.median(o["total"] for o, _ in runs)
        total = statistics.median(m["total"] for _, m in runs)
        many = [m for _, m in runs]

        def tally(key: str, many: list[dict[str, Any]] = many) -> int:
            return sum(m[key] for m in many)

        print(f"{'guarded' if guarded else 'unguarded':10} {one:>6.2f} {total:>6.2f} {total / one:>7.2f} "
              f"{max(m['window'] for m in many):>8.2f} {tally('ids_kept'):>4}/{tally('processes'):<4} "
              f"{tally('one_live_session'):>8}/{tally('conversations'):<5} {tally('summaries'):>9} "
              f"{tally('seed_lost'):>4}/{tally('conversations') * SEED_MESSAGES:<4} "
              f"{tally('turns_lost'):>10}/{tally('turns_doubled'):<7} "
              f"{tally('guard_loaded'):>3}/{tally('processes')}")
        for label, flag in (("own session", False), ("shared session", True)):
            walls = sorted(w for m in many for w, f in zip(m["per_process"], m["shared_flags"], strict=True)
                           if f == flag)
            if walls:
                print(f"{'':10} {label} processes, crossing to end of turn: median {statistics.median(walls):.2f} s,"
                      f" max {walls[-1]:.2f} s")
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
