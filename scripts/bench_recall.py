#!/usr/bin/env python3
"""Recall latency on a session whose snapshots hold 20,000 messages (target: p95 <= 20 ms).

    /work/venvs/h0.19.0/bin/python scripts/bench_recall.py [--messages 20000] [--rounds 5] [--no-host]

Builds one conversation of N snapshot messages (several snapshots, as repeated
compactions produce; the fixture conversation verbatim in the middle one) plus
other sessions in the same state.db, all through the guard's real write path,
then times ``session_guard_recall`` answers for the fixture's model-style
queries and for turn ranges: the whole tool call through Hermes's own dispatch
(``run_agent.handle_function_call``, with the guard installed) when Hermes is
installed, and the recall engine alone. Side by side, in the same run, it times
Hermes's own full-text search (``SessionDB.search_messages``) over the same
messages stored as Hermes rows and prints the ratio (skip with ``--no-host``:
storing 20,000 Hermes rows takes most of a minute).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


_SERVICES = ["api", "worker", "scheduler", "gateway", "search", "auth", "billing", "reports", "notifications",
             "exporter", "ingest", "webhooks"]
_PARTS = ["database", "redis cache", "nginx", "kafka topic", "s3 bucket", "dns record", "load balancer",
          "config map", "cron job", "feature flag", "connection pool", "migration", "index", "queue", "certificate"]
_VERBS = ["restarted", "checked", "rolled back", "scaled", "patched", "reviewed", "tuned", "rebuilt", "drained",
          "re-ran", "disabled", "enabled", "inspected", "benchmarked"]
_OUTCOMES = ["looks fine now", "still shows errors", "latency went down", "needs a follow-up ticket",
             "the error rate is back to normal", "memory usage is stable", "the deploy is blocked",
             "the command timed out", "the file path was wrong", "the value in the config was stale"]


def synthetic_messages(fixture: dict, n: int, rng: random.Random, tag: str) -> list[dict]:
    """``n`` distinct operations-chat messages (same vocabulary as the fixture: services,
    databases, errors, configs, commands; none of its planted specifics)."""
    out = []
    for i in range(n):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            svc, part = rng.choice(_SERVICES), rng.choice(_PARTS)
            sentences.append(
                f"I {rng.choice(_VERBS)} the {part} of the {svc} service and {rng.choice(_OUTCOMES)}"
                f" (took {rng.randint(2, 900)} s, {rng.randint(1, 64)} pods, see /var/log/{svc}/{tag}-{i}.log)"
            )
        if rng.random() < 0.3:
            sentences.append(f"command: kubectl -n {rng.choice(_SERVICES)} get pods -l run={tag}-{i} "
                             f"--field-selector=status.phase!=Running")
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": ". ".join(sentences) + "."})
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="snapshot messages of the measured session")
    parser.add_argument("--snapshots", type=int, default=10, help="compactions they are spread over")
    parser.add_argument("--other-sessions", type=int, default=4, help="other sessions of 5,000 messages each")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-host", action="store_true", help="skip the Hermes search_messages reference")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="session-guard-bench-recall-") as tmp:
        os.environ["HERMES_HOME"] = tmp
        from hermes_session_guard.selftest import recall_eval
        from hermes_session_guard.store import GuardStore
        from hermes_session_guard.summaries.recall import Recall, recall_text

        fixture = recall_eval.load_fixture()
        rng = random.Random(7)
        db_path = Path(tmp) / "state.db"
        store = GuardStore(db_path)
        sid = "20241118_065800_bench0"
        per = args.messages // args.snapshots
        built = time.perf_counter()
        planted_at: list[tuple[str, int]] = []
        for k in range(args.snapshots):
            messages = synthetic_messages(fixture, per, rng, f"s{k}")
            # the fixture conversation itself sits in the middle snapshot, verbatim
            if k == args.snapshots // 2:
                messages[100:100 + len(fixture["messages"])] = [dict(m) for m in fixture["messages"]]
            store.write_snapshot(snapshot_id=f"{sid}.snapshot.{k:03d}", session_id=sid, messages=messages,
                                 index_text=recall_text, created_at=1_700_000_000 + k)
            planted_at.append((f"{sid}.snapshot.{k:03d}", per))
        for o in range(args.other_sessions):
            other = f"20241118_065800_other{o}"
            store.write_snapshot(snapshot_id=f"{other}.snapshot.000", session_id=other,
                                 messages=synthetic_messages(fixture, 5_000, rng, f"o{o}"), index_text=recall_text,
                                 created_at=1_700_000_000)
        build_s = time.perf_counter() - built

        engine = Recall(store=store, session_id=sid, lineage=[sid], max_chars=8000)
        call = engine.run
        how = "recall engine alone (no Hermes here)"
        from hermes_session_guard.selftest import probe

        probe.write_config(Path(tmp), "http://127.0.0.1:9/v1")  # before Hermes imports: it discovers plugins then
        try:
            import run_agent
            from hermes_state import SessionDB

            import hermes_session_guard
        except ImportError:
            pass
        else:
            host = SessionDB(db_path=db_path)  # Hermes's own tables beside the guard's: lineage reads are real
            host.create_session(session_id=sid, source="cli", model="bench")
            probe.discover_guard()  # Hermes loads the plugin: the tool is registered, the seams patched
            assert hermes_session_guard.is_installed()

            def call(args: dict) -> str:
                return run_agent.handle_function_call("session_guard_recall", args, "bench", session_id=sid)

            how = "whole tool call through Hermes's handle_function_call"
        queries = [{"query": p["query"]} for p in fixture["planted"]]
        ranges = [{"turn_start": s, "turn_end": s + 5, "snapshot_id": snap}
                  for snap, n in planted_at for s in (1, n // 2, n - 6)]
        warm = call(queries[0])  # warm the connections and the stemmer
        if not warm.startswith("[session_guard_recall]"):
            print(f"recall answered: {warm[:300]}")
        search_ms: list[float] = []
        search_cpu_ms: list[float] = []
        engine_ms: list[float] = []
        range_ms: list[float] = []
        hits = 0
        for _ in range(args.rounds):
            for q, p in zip(queries, fixture["planted"], strict=True):
                t, c = time.perf_counter(), time.thread_time()
                answer = call(q)
                search_ms.append((time.perf_counter() - t) * 1000)
                search_cpu_ms.append((time.thread_time() - c) * 1000)
                hits += p["text"] in answer
                t = time.perf_counter()
                engine.run(q)
                engine_ms.append((time.perf_counter() - t) * 1000)
            for r in ranges:
                t = time.perf_counter()
                call(r)
                range_ms.append((time.perf_counter() - t) * 1000)
        total = sum(s.message_count for s in store.list_snapshots(sid))
        print(f"session {sid}: {total} snapshot messages in {args.snapshots} snapshots; "
              f"{args.other_sessions} other sessions of 5,000; index built in {build_s:.1f} s")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"measured: {how}; load average {load:.1f} on {os.cpu_count()} cores")
        print(f"recall by query   : n={len(search_ms)} p50 {statistics.median(search_ms):.2f} ms  "
              f"p95 {percentile(search_ms, 0.95):.2f} ms  max {max(search_ms):.2f} ms  "
              f"(exact planted string returned {hits}/{len(search_ms)})")
        print(f"  CPU time        : p50 {statistics.median(search_cpu_ms):.2f} ms  "
              f"p95 {percentile(search_cpu_ms, 0.95):.2f} ms (wall time above includes waiting for a core)")
        print(f"  engine alone    : p50 {statistics.median(engine_ms):.2f} ms  "
              f"p95 {percentile(engine_ms, 0.95):.2f} ms")
        print(f"recall by turns   : n={len(range_ms)} p50 {statistics.median(range_ms):.2f} ms  "
              f"p95 {percentile(range_ms, 0.95):.2f} ms  max {max(range_ms):.2f} ms")
        p95 = max(percentile(search_ms, 0.95), percentile(range_ms, 0.95))

        if not args.no_host:
            try:
                from hermes_state import SessionDB
            except ImportError:
                print("Hermes not installed here: no host reference")
            else:
                host_db = SessionDB(db_path=Path(tmp) / "host_state.db")  # a separate db: the measured one stays small
                host_db.create_session(session_id=sid, source="cli", model="bench")
                with store.reading() as conn:
                    rows = conn.execute(
                        "SELECT m.role, m.content FROM session_guard_snapshot_messages m JOIN session_guard_snapshots s"
                        " ON s.snapshot_id = m.snapshot_id WHERE s.session_id = ? ORDER BY m.snapshot_id, m.position",
                        (sid,),
                    ).fetchall()
                for role, content in rows:
                    host_db.append_message(session_id=sid, role=role, content=content)
                host_ms = []
                host_db.search_messages("database")
                for _ in range(args.rounds):
                    for p in fixture["planted"]:
                        words = " OR ".join(w for w in p["query"].split() if w.isalnum())
                        t = time.perf_counter()
                        host_db.search_messages(words, limit=8)
                        host_ms.append((time.perf_counter() - t) * 1000)
                host_p95 = percentile(host_ms, 0.95)
                print(f"Hermes search_messages over the same rows (reference): p50 "
                      f"{statistics.median(host_ms):.2f} ms  p95 {host_p95:.2f} ms")
                print(f"ratio recall/host p95: {percentile(search_ms, 0.95) / host_p95:.2f}")
                host_db.close()
        store.close()
    ok = p95 <= 20.0
    print(f"bench: p95 {p95:.2f} ms (target <= 20 ms): " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
