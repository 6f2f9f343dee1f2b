"""The bug report's two anomalies on the installed Hermes, guard off then guard on.

Run by ``hermes-session-guard demo`` in a subprocess whose ``HERMES_HOME`` is a
temporary directory; every run gets its own home below it and talks to the bundled
loopback fake LLM. Nothing here imports Hermes at module import time.

Anomaly A (compression during a gateway turn): a real ``GatewayRunner`` with a
fake Telegram adapter; a chat with 48 large turns of history gets a message that
makes the agent compress before answering (preflight), and a follow-up arrives
while the summary is being written.

Anomaly B (two agents compressing one session while a message arrives): two
``AIAgent``s loaded the same 48-turn session, each with a new turn of its own; both
compress it at once from executor threads that last served another session (their
``[session]`` log tag is stale), and a third writer appends a message to the session
while the summary is being written.

Each run reports ids before/after, forks (new session rows), summary calls, turns
left behind under another id, new messages lost, summaries visible, Hermes's
``context compression started/done`` log lines, and the problems these add up to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from .. import host
from ..fail_open import failing_open
from ..store.connection import connect
from . import probe

OTHER_SESSION = "20260528_155201_68dc5996"  # what the executor threads last served (the stale tag)
B_SESSION = "20260528_093510_66bfaec7"
MARKER = "SESSION_GUARD_DEMO "
# 0.19's system prompt probes the local toolchain (pip subprocesses, ~5 s); nothing the demo shows
DEMO_CONFIG: dict[str, Any] = {"agent": {"environment_probe": False}}
_WORD = re.compile(r"\b(?:trigger-a|followup-a|[ab]-new(?:-answer)?|arriving-b)\b")


# -- observing a home ---------------------------------------------------------------------
def _rows(db_path: Path, sid: str) -> list[dict[str, Any]]:
    with closing(connect(db_path, read_only=True)) as conn:
        return host.read_session_rows(conn, sid)


def _texts_under(db_path: Path, sid: str, runtime: Any) -> list[str]:
    """Everything kept under ``sid``: live and archived rows, and the guard's snapshots of it."""
    texts = [str(r.get("content") or "") for r in _rows(db_path, sid)]
    if runtime is not None:
        store = runtime.store_for(db_path)
        for snap in store.list_snapshots(sid):
            texts += [str(m.get("content") or "") for m in store.snapshot_messages(snap.snapshot_id)]
    return texts


def _summaries_visible(db_path: Path, sids: list[str], runtime: Any) -> int:
    """Live summary rows that no guard record marks as a summary: display surfaces show them."""
    from ..store import text_hash
    from ..summaries.tags import is_summary_text

    tagged: set[str] = set()
    if runtime is not None:
        tagged, _ = runtime.store_for(db_path).summary_marks(sids)
    count = 0
    for sid in sids:
        for row in _rows(db_path, sid):
            text = str(row.get("content") or "")
            if host.is_live_row(row) and is_summary_text(text) and text_hash(text) not in tagged:
                count += 1
    return count


def _log_lines(lines: list[str]) -> list[str]:
    """Hermes's ``context compression started/done`` lines as ``[tag] started session=<id>``."""
    out = []
    for line in lines:
        what = "started" if "compression started" in line else "done" if "compression done" in line else None
        sid = next((t.split("=", 1)[1] for t in line.split() if t.startswith("session=")), None)
        if what is None or sid is None:
            continue
        tag = line[1:line.index("]")] if line.startswith("[") else "-"
        out.append(f"[{tag}] {what} session={sid}")
    return out


def _log_problems(lines: list[str]) -> list[str]:
    problems = []
    named = {ln.split("session=", 1)[1] for ln in lines if "session=" in ln}
    if len(named) > 1:
        problems.append(f"the compression log lines of one session name {len(named)} session ids")
    stale = [ln for ln in lines if ln.startswith("[") and f"session={ln[1:ln.index(']')]}" not in ln]
    if stale:
        problems.append(f"{len(stale)} log line(s) tagged with another session")
    return problems


def _observe(db_path: Path, *, before: str, after: list[str], runtime: Any, seeds: list[str], new: list[str],
             lists: list[list[Any]], summary_calls: int, host_lines: list[str]) -> dict[str, Any]:

    with closing(connect(db_path, read_only=True)) as conn:
        sessions = [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY started_at, id")]
    forks = [s for s in sessions if s != before]
    kept = "\n".join(t for sid in dict.fromkeys(after) for t in _texts_under(db_path, sid, runtime))
    held = "\n".join(str(m.get("content") or "") for lst in lists for m in lst if isinstance(m, dict))
    left_behind = [m for m in seeds if m not in kept]
    lost = [m for m in new if m not in kept and m not in held]
    lines = _log_lines(host_lines)
    visible = _summaries_visible(db_path, list(dict.fromkeys(after)), runtime)
    problems = []
    if any(sid != before for sid in after):
        problems.append(f"session id changed: {before} -> {', '.join(dict.fromkeys(after))}")
    if forks:
        problems.append(f"{len(forks)} new session row(s): {', '.join(forks)}")
    if summary_calls > 1:
        problems.append(f"{summary_calls} summary calls for one session")
    if left_behind:
        problems.append(f"{len(left_behind)} earlier turns only under another id")
    if lost:
        problems.append(f"new messages lost: {', '.join(lost)}")
    if visible:
        problems.append(f"{visible} summary row(s) shown as conversation")
    problems += _log_problems(lines)
    return {
        "id_before": before, "ids_after": list(dict.fromkeys(after)), "forks": len(forks),
        "summary_calls": summary_calls, "turns_left_behind": len(left_behind), "messages_lost": lost,
        "summaries_visible": visible, "host_log": lines, "problems": problems, "clean": not problems,
    }


# -- the scenarios ------------------------------------------------------------------------
_T0 = time.perf_counter()  # SESSION_GUARD_DEMO_TRACE=1 prints the phases to stderr


def _phase(what: str) -> None:
    if os.environ.get("SESSION_GUARD_DEMO_TRACE"):
        print(f"demo {time.perf_counter() - _T0:7.2f}s {what}", file=sys.stderr, flush=True)


def _echo(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    found = _WORD.findall(str(users[-1].get("content") if users else ""))
    return "re: " + (found[-1] if found else "?")


async def _stale_executors() -> None:
    """Every default-executor thread last served another session (its log tag is stale)."""
    import hermes_logging

    def serve_other() -> None:
        hermes_logging.set_session_context(OTHER_SESSION)
        time.sleep(0.02)

    loop = asyncio.get_running_loop()
    await asyncio.gather(*(loop.run_in_executor(None, serve_other) for _ in range(24)))


def anomaly_a(llm: Any, home: Path, runtime: Any) -> dict[str, Any]:
    from .gateway import start_gateway

    async def scenario() -> tuple[Any, str, list[str]]:
        llm.reset()
        gw = await start_gateway()
        _phase("gateway started")
        llm.configure(prompt_tokens=500)  # the gateway's hygiene sees a small last prompt: the agent compresses
        await gw.send_text("hi")
        await gw.drain()
        _phase("first turn answered")
        sid = gw.bound_session_id() or ""
        for m in probe.seed_messages(tag="hist"):
            gw.runner.session_store.append_to_transcript(sid, m)
        await _stale_executors()
        gate = threading.Event()
        llm.reset()
        _phase("history seeded")
        llm.configure(reply_fn=_echo, summary_gate=gate, gate_timeout=30.0)
        with probe.capture_host_compression_logs() as lines:
            try:
                await gw.send_text("trigger-a: what is the plan?")
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while not llm.summary_started.is_set() and loop.time() < deadline:
                    await asyncio.sleep(0.01)
                await gw.send_text("followup-a: and the rollback?")
                await asyncio.sleep(0.2)
            finally:
                gate.set()
            _phase("gate released")
            await gw.drain()
            _phase("drained")
        return gw, sid, lines

    gw, sid, lines = asyncio.run(scenario())
    after = gw.bound_session_id() or ""
    answers = [r for r in gw.replies() if r.startswith("re: ")]
    out = _observe(home / "state.db", before=sid, after=[after], runtime=runtime,
                   seeds=[f"hist-{i}:" for i in range(probe.SEED_MESSAGES)], new=["trigger-a", "followup-a"],
                   lists=[], summary_calls=len(llm.summary_requests()), host_lines=lines)
    out["replies"] = answers
    if answers != ["re: trigger-a", "re: followup-a"]:
        out["problems"].append(f"replies: {answers or 'none'} (expected the trigger, then the follow-up)")
        out["clean"] = False
    return out


def anomaly_b(llm: Any, home: Path, runtime: Any, in_place: bool | None) -> dict[str, Any]:
    import hermes_logging

    dbs = [probe.open_db(home / "state.db") for _ in range(4)]
    try:
        seeds = probe.seed_messages()
        probe.seed_session(dbs[0], B_SESSION, seeds)
        agents, lists = [], []
        for i, tag in enumerate(("a-new", "b-new")):
            loaded = dbs[i + 1].get_messages_as_conversation(B_SESSION)
            agent = probe.make_agent(dbs[i + 1], llm.base_url, B_SESSION)
            if in_place is not None and hasattr(agent, "compression_in_place"):
                agent.compression_in_place = in_place
            probe.mark_flushed(agent, loaded)
            agents.append(agent)
            lists.append([*loaded, {"role": "user", "content": f"{tag}: a question only this agent has seen"},
                          {"role": "assistant", "content": f"{tag}-answer: its reply"}])
        gate = threading.Event()
        llm.reset()
        llm.configure(summary_gate=gate, gate_timeout=30.0)
        results: list[Any] = [None, None]
        errors: list[str] = []

        def compress(i: int) -> None:
            hermes_logging.set_session_context(OTHER_SESSION)  # a pool thread that served another session
            with failing_open(f"agent {i}'s compression", "reported, the demo goes on", level=None) as failed:
                results[i], _ = agents[i]._compress_context(lists[i], "You are a test agent.",
                                                            approx_tokens=150_000)
            if failed:
                errors.append(f"agent {i}: {failed.reason}")

        with probe.capture_host_compression_logs() as lines:
            threads = [threading.Thread(target=compress, args=(0,))]
            threads[0].start()
            llm.summary_started.wait(30)
            threads.append(threading.Thread(target=compress, args=(1,)))
            threads[1].start()
            time.sleep(0.3)
            dbs[3].append_message(session_id=B_SESSION, role="user", content="arriving-b: build 7 is green")
            time.sleep(0.3)
            gate.set()
            for t in threads:
                t.join(60)
        out = _observe(home / "state.db", before=B_SESSION, after=[a.session_id for a in agents], runtime=runtime,
                       seeds=[f"turn-{i}:" for i in range(probe.SEED_MESSAGES)],
                       new=["a-new:", "b-new:", "arriving-b:"],
                       lists=[r for r in results if r is not None], summary_calls=len(llm.summary_requests()),
                       host_lines=lines)
        if errors:
            out["problems"] += errors
            out["clean"] = False
        return out
    finally:
        for database in dbs:
            with failing_open("closing a demo state.db", "the connection is left to be collected", advice=None,
                              level=logging.DEBUG):
                database.close()


# -- one process, four runs -----------------------------------------------------------------
def _run(name: str, guard_on: bool, root: Path, llm: Any, in_place: bool | None,
         body: Callable[[Path, Any], dict[str, Any]]) -> dict[str, Any]:
    from ..seams.apply import switch_on, uninstall

    home = root / f"{name}-{'on' if guard_on else 'off'}"
    # Guard off: the plugin is not enabled in that home either (Hermes 0.20+ loads plugins again for
    # each new HERMES_HOME, which would patch it back in).
    probe.write_config(home, llm.base_url, plugin_enabled=guard_on, in_place=in_place, extra=DEMO_CONFIG)
    os.environ["HERMES_HOME"] = str(home)
    os.environ.pop("HERMES_SESSION_ID", None)
    if guard_on:
        runtime = switch_on({"lock": {"wait_seconds": 30.0}})
    else:
        uninstall()
        runtime = None
    started = time.perf_counter()
    _phase(f"{name} guard {'on' if guard_on else 'off'}: start")
    with failing_open(f"demo scenario {name}", "reported in its result", level=None) as failed:
        result = body(home, runtime)
    if failed:
        result = {"problems": [f"scenario failed: {failed.reason}"], "clean": False, "error": True}
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def run_demo(root: Path, release_default: bool) -> dict[str, Any]:
    from ..hostinfo import installed_version, parse_version
    from ..seam_behaviour import Strategy
    from ..seams.table import select_row
    from .fake_llm import FakeLLMServer

    version = installed_version()
    row = select_row("compression", parse_version(version)) if version else None
    has_in_place = row is not None and row.behaviour.strategy in (Strategy.HOST_IN_PLACE, Strategy.HOST_NATIVE)
    # Without --release-default a release that can keep the id itself is put in its rotating mode
    # (compression.in_place: false), so the off column shows what rotating releases do.
    in_place = None if release_default or not has_in_place else False
    mode = "in_place" if has_in_place and in_place is None else "rotate"
    os.environ.setdefault("GATEWAY_ALLOW_ALL_USERS", "true")
    started = time.perf_counter()
    with FakeLLMServer() as llm:
        probe.write_config(root / "discovery", llm.base_url, in_place=in_place, extra=DEMO_CONFIG)
        os.environ["HERMES_HOME"] = str(root / "discovery")
        probe.discover_guard()
        scenarios: list[dict[str, Any]] = []
        for name, title, body in (
            ("A", "compression during a gateway turn (a follow-up arrives meanwhile)",
             lambda home, rt: anomaly_a(llm, home, rt)),
            ("B", "two agents compress one session while a message arrives",
             lambda home, rt: anomaly_b(llm, home, rt, in_place)),
        ):
            off = _run(name, False, root, llm, in_place, body)
            on = _run(name, True, root, llm, in_place, body)
            scenarios.append({"name": name, "title": title, "off": off, "on": on})
    return {
        "ok": all(s["on"]["clean"] for s in scenarios),
        "hermes_version": version, "mode": mode, "release_default": release_default,
        "seconds": round(time.perf_counter() - started, 1), "scenarios": scenarios,
    }


def main() -> int:
    out = sys.stdout
    root = Path(os.environ["HERMES_HOME"])
    release_default = "--release-default" in sys.argv[1:]
    with failing_open("the demo", "reported in its payload", level=None) as failed:
        payload = run_demo(root, release_default)
    if failed.exc is not None:
        import traceback

        payload = {"ok": False, "error": failed.reason, "traceback": "".join(traceback.format_exception(failed.exc))}
    print("\n" + MARKER + json.dumps(payload, default=str), file=out, flush=True)
    return 0 if payload.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
