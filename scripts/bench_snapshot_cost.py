#!/usr/bin/env python3
"""Snapshot cost against session size: time and bytes written to state.db, guarded
vs unguarded, side by side in one run.

    python scripts/bench_snapshot_cost.py [--sizes 200 2000 20000] [--chars 400] [--pairs 3] [--mode rotate]
                                          [--no-strace]

For each size one session of that many messages is seeded once into a template
``HERMES_HOME`` (WAL checkpointed); every measurement copies it and compresses it
once in a fresh process (zero-latency fake LLM served by this one), guarded and
unguarded in alternating order, ``--pairs`` times. The measured region is the
compression plus the end-of-turn flush (the unguarded host defers the child
session's rows to the flush).

* time: median wall time of the pairs;
* bytes: what the process wrote through write(2) in that region (Linux
  ``/proc/self/io`` ``wchar``), and, where ``strace`` is available, the same
  region once more under strace, split by file: ``state.db`` + ``state.db-wal``
  ("to state.db"; a checkpoint writes WAL pages into state.db a second time)
  and SQLite's temporary files (statement journals and sort spills, outside
  state.db);
* snapshot: the guarded snapshot's own bytes (text + JSON of its messages);
* beyond snapshot: (guarded state.db bytes - snapshot bytes) / unguarded state.db
  bytes (target <= 1.1);
* first recall: the guarded run then times the recall-index build the compression
  left to the first recall (``index_missing_snapshots``), outside the region.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

CHILD = r"""
import json, os, sys, time, logging
logging.disable(logging.WARNING)
from pathlib import Path
guarded, base_url, marker = sys.argv[1] == "1", sys.argv[2], sys.argv[3]
home = Path(os.environ["HERMES_HOME"])
import hermes_session_guard
from hermes_session_guard.selftest import probe

def written():
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0

if guarded:
    hermes_session_guard.install()
db = probe.open_db(home / "state.db")
messages = db.get_messages_as_conversation("s")
agent = probe.make_agent(db, base_url, "s")
probe.mark_flushed(agent, messages)
mark = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.write(mark, b"BEGIN")
before, started = written(), time.perf_counter()
out, _ = agent._compress_context(messages, "sys", approx_tokens=10_000_000)
agent._flush_messages_to_session_db(out)
elapsed, grown = time.perf_counter() - started, written() - before
os.write(mark, b"END")
assert len(out) < len(messages), "compression made no progress"
recall_s = None
if guarded:
    from hermes_session_guard.runtime import current_runtime
    from hermes_session_guard.summaries.recall import recall_text
    store = current_runtime().store_for(home / "state.db")
    t = time.perf_counter()
    store.index_missing_snapshots(None, recall_text)
    recall_s = time.perf_counter() - t
db.close()
print("RESULT " + json.dumps({"seconds": elapsed, "wchar": grown, "recall_index_s": recall_s,
                              "messages": len(messages), "after": len(out)}))
"""

_IN_PLACE = {"rotate": False, "in_place": True, "default": None}

SYSCALL = re.compile(r'^(?:\[pid\s+\d+\]\s*|\d+\s+)?(\w+)\((\d+)<([^>]*)>(.*)\)\s+=\s+(-?\d+)')


def _seed(template: Path, n: int, chars: int, base_url: str, py: str, env: dict[str, str], mode: str) -> None:
    """One session ``s`` of ``n`` messages in ``template``, appended one at a time through
    Hermes's own API (as a conversation grows), then checkpointed so every copy
    starts with an empty WAL."""
    code = (
        "import os, sys, logging; logging.disable(logging.WARNING)\n"
        "from pathlib import Path\nfrom hermes_session_guard.selftest import probe\n"
        "home = Path(os.environ['HERMES_HOME'])\n"
        f"probe.write_config(home, {base_url!r}, plugin_enabled=False, in_place={_IN_PLACE[mode]!r})\n"
        "db = probe.open_db(home / 'state.db')\n"
        f"probe.seed_session(db, 's', probe.seed_messages({n}, chars={chars}))\n"
        "db.close()\n"
    )
    subprocess.run([py, "-c", code], env=dict(env, HERMES_HOME=str(template)), check=True)
    conn = sqlite3.connect(str(template / "state.db"))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _snapshot_bytes(path: Path) -> int:
    conn = sqlite3.connect(str(path))
    try:
        row = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(message_json) + LENGTH(COALESCE(content, ''))), 0)"
            " FROM session_guard_snapshot_messages"
        ).fetchone()
    finally:
        conn.close()
    return int(row[0])


def _by_file(trace: Path) -> Counter:
    """Bytes written between the child's BEGIN and END markers, per file class."""
    out: Counter = Counter()
    inside = False
    for line in trace.read_text(errors="replace").splitlines():
        m = SYSCALL.match(line)
        if not m:
            continue
        call, _fd, path, rest, ret = m.groups()
        if path.endswith("bench-marker"):
            inside = "BEGIN" in rest
            continue
        if not inside or call not in ("write", "pwrite64", "writev", "pwritev", "pwritev2"):
            continue
        name = Path(path).name
        if name in ("state.db", "state.db-wal", "state.db-shm"):
            cls = name
        elif name.startswith("etilqs_") or "sqlite" in name.lower():
            cls = "sqlite temp"
        else:
            cls = "other"
        out[cls] += max(0, int(ret))
    return out


def _run(root: Path, template: Path, tag: str, guarded: bool, base_url: str, py: str, env: dict[str, str],
         strace: str | None = None) -> dict:
    home = root / tag
    shutil.copytree(template, home)
    marker = home / "bench-marker"
    cmd = [py, "-c", CHILD, "1" if guarded else "0", base_url, str(marker)]
    trace = home / "strace.txt"
    if strace:
        cmd = [strace, "-f", "-y", "-e", "trace=write,pwrite64,writev,pwritev,pwritev2", "-o", str(trace), *cmd]
    proc = subprocess.run(cmd, env=dict(env, HERMES_HOME=str(home)), capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][7:])
    result["snapshot"] = _snapshot_bytes(home / "state.db") if guarded else 0
    if strace:
        result["files"] = dict(_by_file(trace))
    shutil.rmtree(home, ignore_errors=True)
    return result


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000])
    parser.add_argument("--chars", type=int, default=400, help="characters per message")
    parser.add_argument("--pairs", type=int, default=3, help="timed guarded/unguarded pairs per size")
    parser.add_argument("--no-strace", action="store_true", help="skip the per-file byte split")
    parser.add_argument("--mode", choices=("rotate", "in_place", "default"), default="rotate",
                        help="compression.in_place for the unguarded host (0.18.2+; the guard keeps the id either "
                             "way): rotate (false), in_place (true) or Hermes's default")
    args = parser.parse_args()
    from machine_info import describe, load_average

    from hermes_session_guard.selftest.fake_llm import FakeLLMServer

    strace = None if args.no_strace else shutil.which("strace")
    py = sys.executable
    root_dir = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root_dir), os.environ.get("PYTHONPATH")])))
    env.pop("HERMES_SESSION_ID", None)
    print(describe())
    print(f"unguarded compression.in_place: {args.mode}; {args.chars}-character messages; "
          f"time = median of {args.pairs} pairs; MB = 10^6 bytes; "
          f"per-file split {'by strace' if strace else 'not available (no strace)'}")
    rows = []
    with FakeLLMServer() as llm, tempfile.TemporaryDirectory(prefix="session-guard-snapcost-") as tmp:
        root = Path(tmp)
        for n in args.sizes:
            template = root / f"template-{n}"
            _seed(template, n, args.chars, llm.base_url, py, env, args.mode)
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for i in range(args.pairs):
                for guarded in ((True, False) if i % 2 == 0 else (False, True)):
                    runs[guarded].append(_run(root, template, f"{n}-{i}-{int(guarded)}", guarded, llm.base_url,
                                              py, env))
            traced = {g: _run(root, template, f"{n}-trace-{int(g)}", g, llm.base_url, py, env, strace)
                      for g in (False, True)} if strace else {}
            shutil.rmtree(template, ignore_errors=True)
            rows.append((n, runs, traced))
            _print_size(n, runs, traced)
    print("\nsummary (bytes to state.db = state.db + state.db-wal, from the strace run; wchar = all write(2)):")
    print(f"{'messages':>8} {'unguarded ms':>12} {'guarded ms':>10} {'ungd MB':>8} {'gd MB':>8} {'snap MB':>8} "
          f"{'beyond snap x':>13} {'gd temp MB':>10} {'gd MB/msg':>10} {'1st recall ms':>13}")
    for n, runs, traced in rows:
        tu = statistics.median(r["seconds"] for r in runs[False]) * 1000
        tg = statistics.median(r["seconds"] for r in runs[True]) * 1000
        snap = runs[True][0]["snapshot"]
        recall_ms = statistics.median(r["recall_index_s"] for r in runs[True]) * 1000
        if traced:
            bu, bg = (_db_bytes(traced[g]["files"]) for g in (False, True))
            temp = traced[True]["files"].get("sqlite temp", 0)
        else:
            bu, bg = (statistics.median(r["wchar"] for r in runs[g]) for g in (False, True))
            temp = float("nan")
        beyond = (bg - snap) / bu if bu else float("nan")
        print(f"{n:>8} {tu:>12.0f} {tg:>10.0f} {_mb(bu):>8} {_mb(bg):>8} {_mb(snap):>8} {beyond:>13.2f} "
              f"{_mb(temp):>10} {bg / n / 1e3:>9.1f}k {recall_ms:>13.0f}")
    print(f"load average after: {load_average()}")
    return 0


def _db_bytes(files: dict[str, int]) -> int:
    return files.get("state.db", 0) + files.get("state.db-wal", 0)


def _print_size(n: int, runs: dict[bool, list[dict]], traced: dict[bool, dict]) -> None:
    print(f"\n{n} messages")
    for guarded in (False, True):
        name = "guarded" if guarded else "unguarded"
        times = ", ".join(f"{r['seconds'] * 1000:.0f}" for r in runs[guarded])
        wchar = statistics.median(r["wchar"] for r in runs[guarded])
        line = f"  {name:<9} ms [{times}]  wchar {_mb(wchar)} MB"
        if traced:
            files = traced[guarded]["files"]
            line += "  by file: " + ", ".join(f"{k} {_mb(v)} MB" for k, v in sorted(files.items()))
        print(line)


if __name__ == "__main__":
    sys.exit(main())
