#!/usr/bin/env python3
"""Make corrupted Hermes homes by running the real host WITHOUT the guard.

    PYTHONPATH=. .venvs/hermes-0.14.0/bin/python scripts/make_corrupt_fixtures.py     # any of the 11 releases
    PYTHONPATH=. .venvs/hermes-0.19.0/bin/python scripts/make_corrupt_fixtures.py [--out DIR] [SCENARIO ...]

The scenarios that apply to the installed ``hermes-agent`` are written to
``tests/fixtures/corrupt/hermes-<version>-<scenario>/`` (``config.yaml``,
``state.db.gz``, ``sessions/sessions.json``, ``manifest.json``; unpack
``state.db.gz`` to ``state.db`` to get a Hermes home):

``anomaly-a`` (0.13-0.17)
    two Telegram chats through a real ``GatewayRunner`` (in-process, fake
    platform adapter). Chat 1001: a preflight compression rotates the session,
    the gateway follows the split. Chat 1002: the same, but the gateway process
    is killed (service restart) after the rotation and before the end-of-turn
    flush: the child stays empty and the routing still names the ended parent.
``anomaly-b`` (0.13-0.15)
    one chat served by the gateway while two CLI-style agents (``--resume``)
    work on the same session id: the gateway and one CLI agent compress at the
    same time (two compression children of one parent); the other CLI agent,
    resumed before the compression, keeps writing to the ended parent.
``rotation`` (0.16-0.19, ``compression.in_place: false`` where the host has it)
    chat 1001 compresses twice through the gateway (a lineage of three ids;
    the host writes the parent's rows twice); chat 1002 is killed after the
    rotation (routing left on the ended parent); chat 1003 is killed while the
    summary call is in flight (the native compression lock is left behind).

Every agent turn goes through Hermes's own code against the loopback fake
LLM (``hermes_session_guard.selftest.fake_llm``); this script only seeds history with
``SessionDB.append_message`` (as earlier turns would have) and, to keep the
committed files small, afterwards collapses the repeated filler sentences of
the seeded messages (and of their copies) with one deterministic rewrite, then
VACUUMs and gzips state.db. Each scenario checks with its own SQL that the corruption it plants
really happened and writes it to ``manifest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "corrupt"
SEED_MESSAGES = 40  # ~103K estimated tokens: above the agents' preflight threshold on 0.14 (50%)
SEED_CHARS = 9000  # and 0.19 (75%), below the gateway hygiene threshold (85% of 128K)
KEEP = ("config.yaml", "sessions/sessions.json")
FILLER = re.compile(r"((?:user|assistant) line \d+ about the deployment plan\. )(?:\1)+")


def session_key(chat: str) -> str:
    """The routing key the gateway builds for a Telegram DM (``build_session_key``)."""
    return f"agent:main:telegram:dm:{chat}"


# ---------------------------------------------------------------------------------------------
# Worker side: runs in a subprocess whose HERMES_HOME is the home being corrupted.
# ---------------------------------------------------------------------------------------------


def _db() -> Any:
    from hermes_state import SessionDB

    return SessionDB(db_path=Path(os.environ["HERMES_HOME"]) / "state.db")


def _seed(session_id: str, tag: str) -> None:
    from hermes_session_guard.selftest import probe

    db = _db()
    try:
        for m in probe.seed_messages(SEED_MESSAGES, SEED_CHARS, tag=tag):
            db.append_message(session_id=session_id, role=m["role"], content=m["content"])
    finally:
        db.close()


def _cli_agent(session_id: str, base_url: str) -> tuple[Any, list[dict[str, Any]]]:
    """An agent resumed on ``session_id`` the way ``hermes --resume`` loads it."""
    from hermes_session_guard.selftest import probe

    db = _db()
    history = [m for m in db.get_messages_as_conversation(session_id) if m.get("role") != "session_meta"]
    agent = probe.make_agent(db, base_url, session_id)
    probe.mark_flushed(agent, history)
    return agent, history


def _cli_turn(agent: Any, history: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    result = agent.run_conversation(text, conversation_history=history)
    return list(result.get("messages") or history)


async def _worker(phase: str, chats: list[str], text: str, base_url: str) -> dict[str, Any]:
    from hermes_session_guard.selftest.gateway import start_gateway

    gw = await start_gateway(resume_interrupted=False)

    async def say(chat: str, text: str, wait: bool = True) -> None:
        if wait:
            await gw.say(text, gw.chat(chat), timeout=180.0)
        else:
            await gw.send_text(text, gw.chat(chat))

    def routed(chat: str) -> str:
        gw.runner.session_store._ensure_loaded()  # a fresh worker reads sessions.json before any message
        sid = gw.bound_session_id(gw.chat(chat))
        if sid is None:
            raise KeyError(session_key(chat))
        return str(sid)

    out: dict[str, Any] = {}
    if phase == "setup":
        for chat in chats:
            await say(chat, "hello")
            _seed(routed(chat), tag=f"c{chat}")
            out[chat] = routed(chat)
    elif phase == "seed":
        for chat in chats:
            _seed(routed(chat), tag=f"c{chat}-more")
            out[chat] = routed(chat)
    elif phase == "turn":
        for chat in chats:
            await say(chat, text)
            out[chat] = routed(chat)
    elif phase == "hang":  # the parent process kills us mid-turn
        print("WORKER-HANGING", flush=True)
        await say(chats[0], text, wait=False)
        await asyncio.sleep(600)
    elif phase == "anomaly-b":
        (chat,) = chats
        await say(chat, "hello")
        root = routed(chat)
        # A terminal resumes the session early and keeps its (short) history in memory.
        early, early_history = _cli_agent(root, base_url)
        early_history = _cli_turn(early, early_history, "terminal: what is on the plan today?")
        _seed(root, tag=f"c{chat}")
        # The gateway and a second terminal (full history) compress the same session at once.
        late, late_history = _cli_agent(root, base_url)
        loop = asyncio.get_running_loop()
        other = loop.run_in_executor(None, _cli_turn, late, late_history, "terminal: recap the plan")
        await say(chat, "gateway: question one")
        await other
        # The early terminal writes its next turn to the session it was resumed on.
        _cli_turn(early, early_history, "terminal: add a rollback step")
        out = {chat: routed(chat), "root": root, "early_agent": early.session_id, "late_agent": late.session_id}
    else:
        raise SystemExit(f"unknown phase {phase}")
    return out


def worker_main(args: argparse.Namespace) -> int:
    result = asyncio.run(_worker(args.worker, args.chat, args.text, args.base_url))
    print("WORKER-RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the gateway leaves non-daemon threads behind


# ---------------------------------------------------------------------------------------------
# Orchestrator side: owns the fake LLM and the subprocesses.
# ---------------------------------------------------------------------------------------------


class Home:
    def __init__(self, path: Path, llm: Any) -> None:
        self.path = path
        self.llm = llm

    @property
    def db(self) -> Path:
        return self.path / "state.db"

    def _cmd(self, phase: str, chats: list[str], text: str) -> list[str]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", phase, "--base-url", self.llm.base_url,
               "--text", text]
        for chat in chats:
            cmd += ["--chat", chat]
        return cmd

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, HERMES_HOME=str(self.path), GATEWAY_ALLOW_ALL_USERS="true")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env.pop("HERMES_SESSION_ID", None)
        return env

    def run(self, phase: str, chats: list[str], text: str = "") -> dict[str, Any]:
        proc = subprocess.run(self._cmd(phase, chats, text), env=self._env(), capture_output=True, text=True,
                              timeout=600)
        for line in proc.stdout.splitlines():
            if line.startswith("WORKER-RESULT "):
                return json.loads(line[len("WORKER-RESULT "):])
        raise RuntimeError(f"worker {phase} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")

    def run_and_kill(self, chat: str, text: str, when: Callable[[], bool], timeout: float = 120.0) -> None:
        """Start a gateway turn and SIGKILL the gateway process once ``when()`` holds
        (a service restart or crash at that moment)."""
        proc = subprocess.Popen(self._cmd("hang", [chat], text), env=self._env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        try:
            while not when():
                if proc.poll() is not None:
                    raise RuntimeError(f"gateway exited early: {proc.stderr.read()[-4000:] if proc.stderr else ''}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"condition for killing the gateway of chat {chat} never held")
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.communicate(timeout=30)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()

    # facts, by plain SQL (independent of the guard's own code)
    def children(self, sid: str) -> list[str]:
        return [r[0] for r in self.query(
            "SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY started_at, id", sid)]

    def end_reason(self, sid: str) -> str | None:
        rows = self.query("SELECT end_reason FROM sessions WHERE id = ?", sid)
        return rows[0][0] if rows else None

    def message_count(self, sid: str) -> int:
        return int(self.query("SELECT COUNT(*) FROM messages WHERE session_id = ?", sid)[0][0])

    def routing(self, chat: str) -> str | None:
        path = self.path / "sessions" / "sessions.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        entry = data.get(session_key(chat))
        return entry.get("session_id") if isinstance(entry, dict) else None


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"the host did not produce the planted corruption: {what}")


def _reply_gate(llm: Any) -> threading.Event:
    gate = threading.Event()

    def reply(_body: dict[str, Any]) -> str:
        gate.wait(120)
        return "OK."

    llm.configure(reply_fn=reply)
    return gate


def scenario_anomaly_a(home: Home) -> dict[str, Any]:
    llm = home.llm
    roots = home.run("setup", ["1001", "1002"])
    home.run("turn", ["1001"], "question one")
    s1, (c1,) = roots["1001"], home.children(roots["1001"])
    expect(home.end_reason(s1) == "compression" and home.routing("1001") == c1, "chat 1001 rotated, routing followed")

    s2 = roots["1002"]
    gate = _reply_gate(llm)
    try:
        home.run_and_kill("1002", "question two", lambda: bool(home.children(s2)) and bool(
            [r for r in llm.chat_requests() if "question two" in json.dumps(r.body)]))
    finally:
        gate.set()
        llm.reset()
    (c2,) = home.children(s2)
    expect(home.end_reason(s2) == "compression", "chat 1002 parent ended by compression")
    expect(home.message_count(c2) == 0, "chat 1002 child empty (the end-of-turn flush never ran)")
    expect(home.routing("1002") == s2, "chat 1002 routing left on the ended parent")
    return {
        "description": "anomaly A: compression rotates the id; chat 1002's gateway was killed after the "
                       "rotation and before the end-of-turn flush",
        "lineages": {s1: [s1, c1], s2: [s2, c2]},
        "routing": {session_key("1001"): c1, session_key("1002"): s2},
        "planted": [
            {"signature": "rotated_lineage", "session_id": s1, "sessions": [s1, c1]},
            {"signature": "rotated_lineage", "session_id": s2, "sessions": [s2, c2]},
            {"signature": "empty_compression_child", "session_id": c2, "sessions": [s2, c2]},
            {"signature": "routing_not_at_tip", "session_id": s2, "sessions": [s2, c2],
             "routing_key": session_key("1002")},
        ],
    }


def scenario_anomaly_b(home: Home) -> dict[str, Any]:
    llm = home.llm
    gate = threading.Event()
    llm.configure(summary_gate=gate)

    def release_when_both_compress() -> None:
        llm.wait_for_requests(2, kind="summary", timeout=300)
        gate.set()

    releaser = threading.Thread(target=release_when_both_compress, daemon=True)
    releaser.start()
    try:
        out = home.run("anomaly-b", ["1001"])
    finally:
        gate.set()
        llm.reset()
    root = out["root"]
    children = home.children(root)
    expect(len(children) == 2, f"two compression children of {root}, got {children}")
    expect(home.end_reason(root) == "compression", "parent ended by compression")
    ended_at = home.query("SELECT ended_at FROM sessions WHERE id = ?", root)[0][0]
    late = home.query("SELECT COUNT(*) FROM messages WHERE session_id = ? AND timestamp > ?", root, ended_at)[0][0]
    expect(late >= 2, f"the early terminal wrote its turn to the ended parent ({late} rows)")
    routed = home.routing("1001")
    expect(routed in children, "gateway routing follows its own child")
    planted = [
        {"signature": "rotated_lineage", "session_id": root, "sessions": [root, *children]},
        {"signature": "forked_compression", "session_id": root, "sessions": [root, *children]},
        {"signature": "writes_after_compression_end", "session_id": root, "sessions": [root], "count": late},
    ]
    return {
        "description": "anomaly B: the gateway and a terminal compress one session at once (two children "
                       "of one parent); an earlier terminal keeps writing to the ended parent",
        "lineages": {root: [root, *children]},
        "routing": {session_key("1001"): routed},
        "agents": {"gateway": routed, "terminal_compressing": out["late_agent"],
                   "terminal_early": out["early_agent"]},
        "planted": planted,
    }


def scenario_rotation(home: Home) -> dict[str, Any]:
    llm = home.llm
    roots = home.run("setup", ["1001", "1002", "1003"])
    s1 = roots["1001"]
    home.run("turn", ["1001"], "question one")
    (c1,) = home.children(s1)
    home.run("seed", ["1001"])
    home.run("turn", ["1001"], "question three")
    (c1b,) = home.children(c1)
    expect(home.routing("1001") == c1b, "chat 1001 routing followed both rotations")

    s3 = roots["1003"]
    summary_gate = threading.Event()
    llm.configure(summary_gate=summary_gate)
    try:
        home.run_and_kill("1003", "question four", lambda: llm.summary_started.is_set() and bool(
            home.query("SELECT 1 FROM compression_locks WHERE session_id = ?", s3)))
    finally:
        summary_gate.set()
        llm.reset()

    s2 = roots["1002"]
    gate = _reply_gate(llm)
    try:
        home.run_and_kill("1002", "question two", lambda: bool(home.children(s2)) and bool(
            [r for r in llm.chat_requests() if "question two" in json.dumps(r.body)]))
    finally:
        gate.set()
        llm.reset()
    (c2,) = home.children(s2)
    expect(home.routing("1002") == s2, "chat 1002 routing left on the ended parent")
    expect(bool(home.query("SELECT 1 FROM compression_locks WHERE session_id = ?", s3)), "lock left behind")
    expect(home.end_reason(s3) is None, "chat 1003 not rotated")
    return {
        "description": "rotation (compression.in_place: false where the host has it): chat 1001 rotates twice, "
                       "chat 1002's gateway is "
                       "killed after a rotation, chat 1003's while its summary call is in flight",
        "lineages": {s1: [s1, c1, c1b], s2: [s2, c2]},
        "routing": {session_key("1001"): c1b, session_key("1002"): s2, session_key("1003"): s3},
        "planted": [
            {"signature": "rotated_lineage", "session_id": s1, "sessions": [s1, c1, c1b]},
            {"signature": "rotated_lineage", "session_id": s2, "sessions": [s2, c2]},
            {"signature": "routing_not_at_tip", "session_id": s2, "sessions": [s2, c2],
             "routing_key": session_key("1002")},
            {"signature": "expired_compression_lock", "session_id": s3, "sessions": [s3], "lock": "native",
             "note": "expires 300 s after generation"},
        ],
    }


SCENARIOS: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool | None, Callable[[Home], dict[str, Any]]]] = {
    # name: (since, until, compression.in_place, scenario)
    # anomaly A needs a host that rotates by default (0.18.2+ compacts in place);
    # anomaly B a host without the native compression lock (0.16+ has one, so the
    # second compressor skips); the rotation scenario plants a native lock.
    "anomaly-a": ((0, 13, 0), (0, 18, 0), None, scenario_anomaly_a),
    "anomaly-b": ((0, 13, 0), (0, 16, 0), None, scenario_anomaly_b),
    "rotation": ((0, 16, 0), (0, 23, 0), False, scenario_rotation),
}


def shrink(db_path: Path) -> None:
    """Collapse the repeated filler sentences of seeded messages (and their copies)
    to one sentence, then VACUUM: the structure the host wrote stays as it was."""
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT id, content FROM messages WHERE content LIKE '% about the deployment plan. %'")
        updates = [(FILLER.sub(r"\1", content), mid) for mid, content in rows.fetchall() if content]
        conn.execute("BEGIN")
        conn.executemany("UPDATE messages SET content = ? WHERE id = ?", updates)
        conn.execute("COMMIT")
        for fts in ("messages_fts", "messages_fts_trigram"):  # drop the superseded index segments
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (fts,)).fetchone():
                conn.execute(f"INSERT INTO {fts}({fts}) VALUES ('optimize')")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def make(name: str, out_dir: Path, version: str) -> Path:
    from hermes_session_guard.selftest import probe
    from hermes_session_guard.selftest.fake_llm import FakeLLMServer

    _since, _until, in_place, scenario = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix=f"corrupt-{name}-") as tmp, FakeLLMServer() as llm:
        home = Home(Path(tmp) / "home", llm)
        probe.write_config(home.path, llm.base_url, plugin_enabled=False, in_place=in_place)
        manifest = scenario(home)
        shrink(home.db)
        target = out_dir / f"hermes-{version}-{name}"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for rel in KEEP:
            src = home.path / rel
            if src.exists():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / rel)
        with open(home.db, "rb") as raw, gzip.GzipFile(target / "state.db.gz", "wb", mtime=0) as packed:
            shutil.copyfileobj(raw, packed)
    manifest = {
        "scenario": name,
        "hermes_version": version,
        "generated_by": "scripts/make_corrupt_fixtures.py (real host, no guard, fake LLM)",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **manifest,
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="*", help=f"default: every scenario for this host ({', '.join(SCENARIOS)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--chat", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--text", default="", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)

    sys.path.insert(0, str(ROOT))
    from hermes_session_guard.hostinfo import installed_version, parse_version

    version = installed_version()
    if version is None:
        raise SystemExit("hermes-agent is not installed in this environment")
    host = parse_version(version)
    names = args.scenario or [n for n, (since, until, _, _) in SCENARIOS.items() if since <= host < until]
    if not names:
        raise SystemExit(f"no scenario for Hermes {version}")
    for name in names:
        since, until, _, _ = SCENARIOS[name]
        if not since <= host < until:
            raise SystemExit(f"scenario {name} needs another Hermes release than {version}")
        started = time.monotonic()
        target = make(name, args.out, version)
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        print(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}: {size // 1024} KiB "
              f"in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
