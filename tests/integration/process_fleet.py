"""Many agent processes crossing the compression threshold together: the plan of homes
and sessions, their seeding, and the launch of ``compression_driver.py`` per process
behind one shared go file. Used by test_multi_process_compression.py and
scripts/bench_processes.py (stdlib and the guard's probe only, no pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import iter_message_text

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("compression_driver.py")
SHARED_HOME = "shared-home"
SHARED_SID = "20260528_155201_68dc5996"

Plan = list[tuple[Path, str, str]]


def marker_answer(body: dict[str, Any]) -> str:
    """Answer naming the question's marker, so every reply can be traced to its turn."""
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            # the turn's own question is the last one (Hermes may merge consecutive user turns)
            markers = [t for t in " ".join(iter_message_text(m.get("content"))).split() if t.endswith("-next:")]
            if markers:
                return f"{markers[-1][: -len('-next:')]}-reply: answered"
            break
    return "OK."


def plan_for(root: Path, own: int, shared: int) -> Plan:
    """(home, session id, tag) per process: ``own`` with a home and session each, then
    ``shared`` sharing one home and one session."""
    plan = [(root / f"home-{i}", f"20260528_0935{i:02d}_0a{i:04x}", f"p{i}") for i in range(own)]
    return plan + [(root / SHARED_HOME, SHARED_SID, f"s{j}") for j in range(shared)]


def seed_tags(plan: Plan) -> dict[str, str]:
    """Session id -> the tag its seeded messages carry ("shared" for the shared session)."""
    return {sid: ("shared" if sid == SHARED_SID else tag) for _, sid, tag in plan}


def seed_homes(plan: Plan, base_url: str, *, in_place: bool | None, plugin_enabled: bool = True) -> None:
    """Config and a seeded session (48 messages) per home of the plan."""
    tags = seed_tags(plan)
    for home, sid in sorted({(h, s) for h, s, _ in plan}):
        probe.write_config(home, base_url, plugin_enabled=plugin_enabled, in_place=in_place,
                           extra={"session_guard": {"lock": {"wait_seconds": 60.0}}})
        db = probe.open_db(home / "state.db")
        probe.seed_session(db, sid, probe.seed_messages(tag=tags[sid]))
        db.close()


class FleetFailed(RuntimeError):
    """A process died or the fleet did not get ready in time."""


def run_fleet(root: Path, plan: Plan, base_url: str, *, in_place: bool | None, timeout: float,
              driver_timeout: float | None = None) -> tuple[list[dict[str, Any]], list[subprocess.Popen[bytes]], float]:
    """Start one driver per process, release them together once all are ready, wait for
    them. Returns their JSON reports, the finished processes and the go time (epoch s)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("HERMES_SESSION_ID", None)
    go = root / "go"
    procs: list[subprocess.Popen[bytes]] = []
    for n, (home, sid, tag) in enumerate(plan):
        cmd = [sys.executable, str(DRIVER), "--home", str(home), "--sid", sid, "--tag", tag,
               "--base-url", base_url, "--ready", str(root / f"ready-{n}"), "--go", str(go),
               "--out", str(root / f"out-{n}.json")]
        if driver_timeout is not None:
            cmd += ["--timeout", f"{driver_timeout:g}"]
        if in_place is not None:
            cmd.append("--in-place" if in_place else "--rotate")
        with open(root / f"err-{n}.txt", "w") as err:
            procs.append(subprocess.Popen(cmd, env=dict(env, HERMES_HOME=str(home)), stdout=subprocess.DEVNULL,
                                          stderr=err))
    try:
        deadline = time.monotonic() + timeout
        while not all((root / f"ready-{n}").exists() for n in range(len(plan))):
            dead = [n for n, p in enumerate(procs) if p.poll() is not None]
            if dead:
                raise FleetFailed("agent processes died before they got ready:\n"
                                  + "\n".join((root / f"err-{n}.txt").read_text()[-2000:] for n in dead))
            if time.monotonic() > deadline:
                raise FleetFailed("agent processes did not get ready")
            time.sleep(0.05)
        go_at = time.time()
        go.touch()
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    reports = [json.loads((root / f"out-{n}.json").read_text()) for n in range(len(plan))]
    return reports, procs, go_at
