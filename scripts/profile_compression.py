#!/usr/bin/env python3
"""Where a guarded compression spends its time and its writes, step by step.

    python scripts/profile_compression.py [--messages 48] [--chars 14000] [--runs 10]
                                          [--strace] [--split-fts]

Compresses ``--runs`` freshly seeded sessions with the guard installed (zero-latency
fake LLM, in this process; a first run warms caches and is not counted) and times
each step by wrapping it: Hermes's calls the guard makes (``replace_messages``,
``get_messages_as_conversation``, ``update_system_prompt``) and the guard's own
store operations. Per compression: wall and CPU ms, bytes written through
write(2) (``/proc/self/io``), and transactions committed on Hermes's and on the
guard's connection (SQLite statement trace).

``--strace`` runs one more compression in a child process under ``strace`` and
splits its writes and fsyncs by step and file (state.db, WAL, SQLite temporary
files). ``--split-fts`` deletes the seeded rows of one session again on scratch
copies of the seeded database, as Hermes's ``replace_messages`` does: as it is,
without Hermes's FTS5 delete triggers (what Hermes's full-text indexes cost), and
with two connection settings (in-memory statement journal, a 64 MiB page cache).
Those copies are throwaway files in a temporary directory; nothing the guard
ships ever changes Hermes's schema or settings.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

STORE_STEPS = ("begin_compression", "try_acquire_lease", "generation", "snapshot_exists", "write_snapshot",
               "record_compaction", "release_lease")
HOST_ADAPTER_STEPS = ("notify_boundary", "commit_memory", "rebase_flush")
HERMES_STEPS = ("replace_messages", "get_messages_as_conversation", "update_system_prompt",
                "try_acquire_compression_lock", "release_compression_lock")


def _written() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Steps:
    """Wall ms, CPU ms, bytes and calls per wrapped step; optional strace markers."""

    def __init__(self, marker: int | None = None) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: Counter = Counter()
        self.marker = marker
        self.on = False

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            if self.marker is not None:
                os.write(self.marker, f"B:{label}".encode())
            w, c, b = time.perf_counter(), time.process_time(), _written()
            try:
                return original(*args, **kwargs)
            finally:
                self.wall[label] += time.perf_counter() - w
                self.cpu[label] += time.process_time() - c
                self.bytes[label] += _written() - b
                self.calls[label] += 1
                if self.marker is not None:
                    os.write(self.marker, f"E:{label}".encode())

        setattr(owner, name, timed)


def _profile(args: argparse.Namespace, marker: int | None = None) -> dict[str, Any]:
    import logging

    logging.disable(logging.WARNING)
    import hermes_session_guard
    from hermes_session_guard import host
    from hermes_session_guard.runtime import current_runtime
    from hermes_session_guard.selftest import probe
    from hermes_session_guard.selftest.fake_llm import FakeLLMServer
    from hermes_session_guard.store import GuardStore

    home = Path(os.environ["HERMES_HOME"])
    steps = Steps(marker)
    commits: Counter = Counter()
    totals: list[tuple[float, float, int]] = []
    with FakeLLMServer() as llm:
        probe.write_config(home, llm.base_url, plugin_enabled=False, in_place=False)
        db = probe.open_db(home / "state.db")
        from hermes_state import SessionDB

        for name in HERMES_STEPS:
            if hasattr(SessionDB, name):  # the compression lock API exists from 0.16
                steps.wrap(SessionDB, name, f"hermes {name}")
        for name in STORE_STEPS:
            steps.wrap(GuardStore, name, f"guard store {name}")
        for name in HOST_ADAPTER_STEPS:
            # the package (callers elsewhere) and the submodule that defines it (calls inside host)
            steps.wrap(sys.modules[getattr(host, name).__module__], name, f"guard {name}")
            steps.wrap(host, name, f"guard {name}")
        hermes_session_guard.install()
        base = probe.seed_messages(args.messages, chars=args.chars)
        runs = 1 if marker is not None else args.runs
        for i in range(runs + 1):
            sid = f"profile_{i}"
            messages = [dict(m) for m in base]
            probe.seed_session(db, sid, messages)
            agent = probe.make_agent(db, llm.base_url, sid)
            probe.mark_flushed(agent, messages)
            store = current_runtime().store_for(home / "state.db")
            guard_conn = store._connect()
            counting = i > 0

            def count(who: str, sql: str, counting: bool = counting) -> None:
                if counting and sql.strip().upper() == "COMMIT":
                    commits[who] += 1

            guard_conn.set_trace_callback(functools.partial(count, "guard"))
            db._conn.set_trace_callback(functools.partial(count, "hermes"))
            steps.on = counting
            if marker is not None and counting:
                os.write(marker, b"B:compression")
            w, c, b = time.perf_counter(), time.process_time(), _written()
            out, _ = agent._compress_context(messages, "sys", approx_tokens=150_000)
            elapsed = (time.perf_counter() - w, time.process_time() - c, _written() - b)
            if marker is not None and counting:
                os.write(marker, b"E:compression")
            steps.on = False
            guard_conn.set_trace_callback(None)
            db._conn.set_trace_callback(None)
            assert len(out) < len(messages), "compression made no progress"
            if counting:
                totals.append(elapsed)
        hermes_session_guard.uninstall()
        db.close()
    n = len(totals)
    return {
        "runs": n,
        "total": {"wall": statistics.median(t[0] for t in totals), "cpu": statistics.median(t[1] for t in totals),
                  "bytes": statistics.median(t[2] for t in totals)},
        "steps": {k: {"wall": steps.wall[k] / n, "cpu": steps.cpu[k] / n, "bytes": steps.bytes[k] / n,
                      "calls": steps.calls[k] / n} for k in steps.calls},
        "commits": {k: v / n for k, v in commits.items()},
    }


SYSCALL = re.compile(r'^(?:\[pid\s+\d+\]\s*|\d+\s+)?(\w+)\((\d+)<([^>]*)>(.*)\)\s+=\s+(-?\d+)')


def _file_class(path: str) -> str:
    name = Path(path).name
    if name in ("state.db", "state.db-wal", "state.db-shm"):
        return name
    if name.startswith("etilqs_"):
        return "sqlite temp"
    return "other"


def _strace_split(args: argparse.Namespace) -> None:
    strace = shutil.which("strace")
    if not strace:
        print("\n(--strace: strace is not installed here)")
        return
    with tempfile.TemporaryDirectory(prefix="session-guard-profile-") as tmp:
        trace, marker = Path(tmp) / "trace.txt", Path(tmp) / "profile-marker"
        cmd = [strace, "-f", "-y", "-s", "128", "-o", str(trace),
               "-e", "trace=write,pwrite64,writev,pwritev,fsync,fdatasync", sys.executable, __file__,
               "--child", str(marker), "--messages", str(args.messages), "--chars", str(args.chars)]
        env = dict(os.environ, HERMES_HOME=str(Path(tmp) / "home"))
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        written: Counter = Counter()
        syncs: Counter = Counter()
        stack: list[str] = []
        for line in trace.read_text(errors="replace").splitlines():
            m = SYSCALL.match(line)
            if not m:
                continue
            call, _fd, path, rest, ret = m.groups()
            if path.endswith("profile-marker"):
                mark = re.search(r'"([BE]):([^"]*)"', rest)
                if mark and mark.group(1) == "B":
                    stack.append(mark.group(2))
                elif mark and stack:
                    stack.pop()
                continue
            if not stack:
                continue
            key = (stack[-1], _file_class(path))
            if call in ("fsync", "fdatasync"):
                syncs[key] += 1
            else:
                written[key] += max(0, int(ret))
    print("\none compression under strace: bytes written (MB) and fsyncs, by step and file")
    print(f"  {'step':<42} {'file':<13} {'MB':>7} {'fsyncs':>6}")
    for key in sorted(set(written) | set(syncs), key=lambda k: -written.get(k, 0)):
        if written.get(key, 0) < 1000 and not syncs.get(key):
            continue
        label = key[0] if key[0] != "compression" else "(host compression, outside the steps)"
        print(f"  {label:<42} {key[1]:<13} {written.get(key, 0) / 1e6:>7.2f} {syncs.get(key, 0):>6}")


def _split_fts(args: argparse.Namespace) -> None:
    """Hermes's DELETE of one session's rows on scratch copies, with and without its FTS5 triggers."""
    import logging

    logging.disable(logging.WARNING)
    from hermes_session_guard.selftest import probe

    with tempfile.TemporaryDirectory(prefix="session-guard-fts-") as tmp:
        seed = Path(tmp) / "seed"
        os.environ["HERMES_HOME"] = str(seed)
        db = probe.open_db(seed / "state.db")
        for k in range(3):  # other conversations in the same file, as in real use
            others = probe.seed_messages(min(args.messages, 200), chars=args.chars, tag=f"o{k}")
            probe.seed_session(db, f"other_{k}", others)
        probe.seed_session(db, "target", probe.seed_messages(args.messages, chars=args.chars))
        db.close()
        conn = sqlite3.connect(str(seed / "state.db"))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        # (label, triggers dropped, connection settings): the last two try settings a guard
        # could give Hermes's connection for the duration of replace_messages.
        variants = [
            ("as Hermes has it", [], []),
            ("without the FTS5 trigram delete trigger", ["messages_fts_trigram_delete"], []),
            ("without both FTS5 delete triggers", ["messages_fts_trigram_delete", "messages_fts_delete"], []),
            ("as it is, PRAGMA temp_store=MEMORY", [], ["PRAGMA temp_store=MEMORY"]),
            ("as it is, PRAGMA cache_size=-65536", [], ["PRAGMA cache_size=-65536"]),
        ]
        print(f"\nHermes's DELETE of one session's {args.messages} rows ({args.chars} characters each), "
              f"median of {args.runs} scratch copies")
        for label, drop, settings in variants:
            times, cpus, sizes = [], [], []
            for r in range(args.runs):
                copy = Path(tmp) / f"copy-{r}.db"
                shutil.copy(seed / "state.db", copy)
                conn = sqlite3.connect(str(copy), isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                for trigger in drop:
                    conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
                for setting in settings:
                    conn.execute(setting)
                w, c, b = time.perf_counter(), time.process_time(), _written()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM messages WHERE session_id = 'target'")
                conn.execute("COMMIT")
                times.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
                sizes.append(_written() - b)
                conn.close()
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{copy}{suffix}").unlink(missing_ok=True)
            print(f"  {label:<42} wall {statistics.median(times) * 1000:7.1f} ms  cpu "
                  f"{statistics.median(cpus) * 1000:7.1f} ms  written {statistics.median(sizes) / 1e6:6.2f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=48)
    parser.add_argument("--chars", type=int, default=14_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--split-fts", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fd = os.open(args.child, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        _profile(args, marker=fd)
        return 0
    os.environ.setdefault("HERMES_HOME", tempfile.mkdtemp(prefix="session-guard-profile-"))
    os.environ.pop("HERMES_SESSION_ID", None)
    from machine_info import describe, load_average

    print(describe())
    result = _profile(args)
    t = result["total"]
    print(f"guarded compression of {args.messages} messages x {args.chars} characters, {result['runs']} runs: "
          f"median wall {t['wall'] * 1000:.1f} ms, cpu {t['cpu'] * 1000:.1f} ms, written {t['bytes'] / 1e6:.2f} MB")
    print("  transactions committed per compression: "
          + ", ".join(f"{k} connection {v:.1f}" for k, v in sorted(result["commits"].items())))
    print(f"  {'step (mean per compression)':<42} {'calls':>5} {'wall ms':>8} {'cpu ms':>7} {'MB':>6}")
    for label, s in sorted(result["steps"].items(), key=lambda kv: -kv[1]["cpu"]):
        print(f"  {label:<42} {s['calls']:>5.1f} {s['wall'] * 1000:>8.2f} {s['cpu'] * 1000:>7.2f} "
              f"{s['bytes'] / 1e6:>6.2f}")
    if args.strace:
        _strace_split(args)
    if args.split_fts:
        _split_fts(args)
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
