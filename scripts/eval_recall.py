#!/usr/bin/env python3
"""Recall eval against the installed Hermes: compact hermes_session_guard/selftest/data/recall_conversation.json,
then ask session_guard_recall for every planted specific with the query a model would
send, and report how often the exact planted string comes back.

    /work/venvs/h0.19.0/bin/python scripts/eval_recall.py [--json] [--show-misses]

Runs offline (temporary HERMES_HOME, loopback fake LLM). Exit status 0 when the score
is at least 98 % over every planted item and over the ones the host compacted, and the
host compacted at least one (so the eval measured recall of compacted turns at all).
Planted turns the host left outside its compacted span (36 of 78 on 0.22.2, which keeps a
longer tail; docs/compatibility.md) are reported, not counted against it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--show-misses", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="session-guard-recall-eval-") as tmp:
        os.environ["HERMES_HOME"] = tmp
        os.environ.pop("HERMES_SESSION_ID", None)
        from hermes_session_guard.selftest import probe, recall_eval
        from hermes_session_guard.selftest.fake_llm import FakeLLMServer

        fixture = recall_eval.load_fixture()
        with FakeLLMServer() as llm:
            recall_eval.write_eval_config(Path(tmp), llm.base_url, fixture)
            probe.discover_guard()
            result = recall_eval.run_recall_eval(Path(tmp), llm.base_url, fixture)
    lat = sorted(result.latencies_ms)
    p95 = lat[int(0.95 * (len(lat) - 1))] if lat else 0.0
    report = {
        "host_version": result.host_version,
        "planted": result.total,
        "compacted_turns": result.compacted,
        "not_compacted": [r["id"] for r in result.outside],
        "exact_hits": result.hits,
        "score": round(result.score, 4),
        "in_first_passage": round(result.top(1), 4),
        "in_first_three_passages": round(result.top(3), 4),
        "target": recall_eval.TARGET,
        "recall_ms_p50": round(lat[len(lat) // 2], 2) if lat else None,
        "recall_ms_p95": round(p95, 2),
        "misses": [r for r in result.rows if not r["hit"]],
    }
    ok, why = recall_eval.verdict(result, recall_eval.TARGET)
    report["verdict"] = why
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(f"Hermes {report['host_version']}: {result.total} planted specifics, compacted turns "
              f"{result.compacted}, {len(result.outside)} outside the compacted part")
        print(f"exact recall: {result.hits}/{result.total} = {result.score:.1%} (target {recall_eval.TARGET:.0%}); "
              f"in the first passage {result.top(1):.1%}, in the first three {result.top(3):.1%}")
        print(f"recall latency through Hermes's tool dispatch: p50 {report['recall_ms_p50']} ms, p95 {p95:.2f} ms")
        if args.show_misses or not ok:
            for miss in report["misses"]:
                print(f"  MISS #{miss['id']} ({miss['kind']}) query={miss['query']!r} wanted={miss['text']!r}")
        print("eval: " + ("PASSED" if ok else "FAILED") + f" ({why})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
