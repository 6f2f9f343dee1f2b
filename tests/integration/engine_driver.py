"""One Hermes process with a third-party context engine selected, under the guard.

Launched by ``test_context_engines.py`` (and usable by hand)::

    python engine_driver.py --home H --base-url URL --engine NAME --out RESULT.json

``H`` already holds config.yaml (the guard and the engine plugin enabled,
``context.engine: NAME``) and the plugin under ``H/plugins/NAME``. Hermes's own
plugin discovery loads both; the driver then compresses a seeded 48-message
session through the real ``AIAgent``, lets a second agent with the same stale list
try again, runs one more turn, and writes what it saw (ids, snapshot, tags, the
engine's session callbacks and state, what a reload shows, recall) as JSON. The
test makes the assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path
from typing import Any

SID = "20260701_090000_e0e0e0"
SYSTEM = "You are a test agent."


def _record_callbacks(engine_cls: type, calls: list[dict[str, Any]]) -> None:
    """Log every session callback the engine gets (the class's own methods still run)."""
    for name in ("on_session_start", "on_session_reset", "on_session_end"):
        original = getattr(engine_cls, name, None)
        if original is None:
            continue

        def recorder(self: Any, *args: Any, __name: str = name, __original: Any = original, **kwargs: Any) -> Any:
            calls.append({"callback": __name, "session_id": str(args[0]) if args else None,
                          **{k: str(v) for k, v in kwargs.items()
                             if k in ("boundary_reason", "old_session_id")}})
            return __original(self, *args, **kwargs)

        setattr(engine_cls, name, recorder)


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["HERMES_HOME"] = args.home  # before the first Hermes import
    os.environ.pop("HERMES_SESSION_ID", None)
    from hermes_session_guard import current_runtime
    from hermes_session_guard.host import engines as engine_support
    from hermes_session_guard.selftest import probe
    from hermes_session_guard.summaries.recall_tool import handler as recall
    from hermes_session_guard.summaries.tags import SUMMARY_TAG
    from hermes_session_guard.summaries.visibility import HIDDEN, display_messages

    home = Path(args.home)
    probe.discover_guard()
    runtime = current_runtime()
    if args.without_guard:
        return without_guard(home, args)
    db = probe.open_db(home / "state.db")
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = probe.make_agent(db, args.base_url, SID)
    probe.mark_flushed(agent, messages)
    engine = agent.context_compressor
    out: dict[str, Any] = {"guard_loaded": runtime is not None, "engine_name": getattr(engine, "name", None),
                           "engine_class": type(engine).__name__}
    calls: list[dict[str, Any]] = []
    _record_callbacks(type(engine), calls)
    seen: dict[str, Any] = {"compress_calls": 0, "compressing_during": []}

    def observer(_engine: Any) -> None:
        seen["compress_calls"] += 1
        # What the gateway's busy-message seam asks before buffering a message.
        seen["compressing_during"].append(runtime.compressing.op_for(SID) if runtime else None)

    type(engine).observer = observer
    out["support"] = engine_support.assess(engine).as_dict()

    compressed, _ = agent._compress_context(list(messages), SYSTEM, approx_tokens=150_000)
    out["session_id_after"] = agent.session_id
    out["messages_after"] = len(compressed)
    out["tagged_positions"] = [i for i, m in enumerate(compressed) if isinstance(m, dict) and m.get(SUMMARY_TAG)]
    out["tagged_texts"] = [str(compressed[i].get("content")) for i in out["tagged_positions"]]
    out["first_seed_kept"] = [str(m.get("content"))[:9] for m in compressed[:3]]

    # A second agent of the same session with the pre-compression list: it must not compress again.
    late = probe.make_agent(db, args.base_url, SID)
    probe.mark_flushed(late, messages)
    late_list, _ = late._compress_context(list(messages), SYSTEM, approx_tokens=150_000)
    out["late_session_id"] = late.session_id
    out["late_messages"] = len(late_list)

    # One more turn on the compacted list, against a provider that refuses unknown keys.
    llm_reply = agent.run_conversation("engine test: one more question", conversation_history=compressed)
    out["next_turn_answer"] = llm_reply.get("final_response")
    out["session_id_after_turn"] = agent.session_id
    out["callbacks"] = list(calls)
    out["compress_calls"] = seen["compress_calls"]
    out["compressing_during"] = seen["compressing_during"]
    out["engine_session_id"] = str(getattr(engine, "session_id", "") or getattr(engine, "_session_id", "") or "")

    store = runtime.store_for(home / "state.db")
    snaps = store.list_snapshots(SID)
    out["snapshots"] = [s.snapshot_id for s in snaps]
    out["snapshot_verbatim"] = bool(snaps) and [
        (m.get("role"), m.get("content")) for m in store.snapshot_messages(snaps[0].snapshot_id)
    ] == [(m["role"], m["content"]) for m in messages]
    out["sessions"] = [r["id"] for r in probe.sessions_table(home / "state.db")]

    loaded = db.get_messages_as_conversation(SID)  # what CLI resume, the gateway, TUI and ACP load
    out["loaded_tagged_texts"] = [str(m.get("content")) for m in loaded if m.get(SUMMARY_TAG)]
    shown = display_messages(loaded, HIDDEN)
    out["shown_count"], out["loaded_count"] = len(shown), len(loaded)
    out["shown_texts"] = [str(m.get("content")) for m in shown]
    out["recall"] = recall({"query": "turn-20"}, session_id=SID)
    if out["engine_name"] == "ledger-engine":
        ledger = json.loads((home / "ledger-engine" / f"{SID}.json").read_text(encoding="utf-8"))
        out["ledger_entries"] = len(ledger["entries"])
        out["ledger_files"] = sorted(p.name for p in (home / "ledger-engine").iterdir())
    before_gateway = len(calls)
    out["gateway"] = buffered_through_gateway(home, runtime, type(engine))
    out["gateway"]["callbacks"] = calls[before_gateway:]
    return out


def buffered_through_gateway(home: Path, runtime: Any, engine_cls: type) -> dict[str, Any]:
    """The selftest's gateway check with this engine active: through the real
    GatewayRunner, a message that arrives while the session compresses is buffered and
    answered after the one that triggered the compression, on the same id. The engine
    is held inside its compress on the same gate as the fake summary model."""
    import yaml

    from hermes_session_guard.selftest.fake_llm import FakeLLMServer
    from hermes_session_guard.selftest.gateway import check_buffered_delivery
    from hermes_session_guard.selftest.probe import ProbeResult

    seen: list[str] = []
    with FakeLLMServer() as llm:
        path = home / "config.yaml"
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        cfg["model"]["base_url"] = llm.base_url
        path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

        def held(engine: Any) -> None:
            seen.append(type(engine).__name__)
            gate = llm.summary_gate
            if gate is not None:
                gate.wait(30)

        engine_cls.observer = held  # type: ignore[attr-defined]
        result = ProbeResult()
        check_buffered_delivery(result, llm, runtime)
    return {"checks": result.checks, "engine_runs": seen}


def without_guard(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Hermes as shipped (the guard not enabled in config.yaml): one compression, then
    where the engine's own state is."""
    from hermes_session_guard.selftest import probe

    db = probe.open_db(home / "state.db")
    messages = probe.seed_messages()
    probe.seed_session(db, SID, messages)
    agent = probe.make_agent(db, args.base_url, SID)
    probe.mark_flushed(agent, messages)
    engine = agent.context_compressor
    calls: list[dict[str, Any]] = []
    _record_callbacks(type(engine), calls)
    agent._compress_context(list(messages), SYSTEM, approx_tokens=150_000)
    after = agent.session_id
    folder = home / "ledger-engine"
    ledgers = {p.stem: len(json.loads(p.read_text(encoding="utf-8"))["entries"]) for p in folder.glob("*.json")}
    return {"engine_name": getattr(engine, "name", None), "session_id_after": after, "callbacks": calls,
            "engine_session_id": str(getattr(engine, "session_id", "")), "ledger_entries_by_id": ledgers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--without-guard", action="store_true")
    args = parser.parse_args()
    try:
        result = run(args)
    except Exception:
        result = {"error": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
