"""The machine a benchmark ran on, printed with every figure.

    from machine_info import describe, load_average
    print(describe())  # CPU model, cores, load average, Python, SQLite, Hermes

Imported by the ``bench_*.py`` scripts (they run as ``python scripts/bench_x.py``,
so this directory is on ``sys.path``).
"""

from __future__ import annotations

import os
import platform
import sqlite3
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1/5/15-minute load averages, or ``n/a`` where the OS has none."""
    try:
        return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def hermes_version() -> str:
    try:
        from hermes_session_guard.hostinfo import installed_version

        return str(installed_version())
    except Exception:  # no Hermes in this environment
        return "none"


def describe() -> str:
    return (
        f"machine: {cpu_model()} ({platform.machine()}), {os.cpu_count()} cores, "
        f"load average {load_average()}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, hermes-agent {hermes_version()}"
    )


def checkpoint(db_path: Path) -> None:
    """Move everything committed from the WAL into state.db and empty the WAL."""
    conn = sqlite3.connect(str(db_path), timeout=30)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


def write_bytes() -> int | None:
    """Bytes this process caused to be written to storage so far (Linux), else None."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
