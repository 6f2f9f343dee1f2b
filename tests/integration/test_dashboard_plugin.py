"""The guard in ``hermes dashboard``'s own process, which loads no agent plugins.

A conversation is compressed under the guard; then Hermes's dashboard app
(``hermes_cli.web_server``) is started in a fresh process on the same home, the
way ``hermes dashboard`` starts it: nothing of the guard is imported there but
what Hermes itself loads. After ``enable`` (which writes the dashboard plugin)
the dashboard's search finds the compacted turn under the conversation's id and
its status route says the guard is on; after ``disable`` the plugin is gone and
the dashboard is Hermes as shipped (on releases whose own search does not reach
the compacted turns, the hit is gone too).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_session_guard import dashboard_plugin
from hermes_session_guard.selftest import probe
from hermes_session_guard.selftest.fake_llm import FakeLLMServer
from hermes_session_guard.summaries.tags import is_summary_text

from .conftest import dashboard_unavailable, new_agent
from .test_home_check_commands import run_cli

ROOT = Path(__file__).resolve().parents[2]
SID = "20260603_090000_da5b0a"
TOKEN = "zephyrdashboard4412"
KEY = "sk-proj-Zq8vT3kLmN4pR7sX2wY9bC1dF6gH0jK5"



@pytest.fixture(autouse=True)
def _dashboard_here() -> None:
    why = dashboard_unavailable()
    if why:
        pytest.skip(why)

DASHBOARD = """
import json, sys
from fastapi.testclient import TestClient
from hermes_cli import web_server

client = TestClient(web_server.app, base_url="http://127.0.0.1")
auth = {"Authorization": f"Bearer {web_server._SESSION_TOKEN}"}
found = client.get("/api/sessions/search", params={"q": sys.argv[1]}, headers=auth)
status = client.get("/api/plugins/session-guard/status", headers=auth)
shown = client.get(f"/api/sessions/{sys.argv[2]}/messages", headers=auth)
records = client.get("/api/plugins/session-guard/compactions", headers=auth)
one = client.get("/api/plugins/session-guard/compactions", params={"session": sys.argv[2]}, headers=auth)
listed = records.json().get("compactions") if "json" in records.headers.get("content-type", "") else None
op = {"session": sys.argv[2], "op": listed[0]["op_id"] if listed else "none"}
opened = client.get("/api/plugins/session-guard/compaction", params=op, headers=auth)
opened_without_token = client.get("/api/plugins/session-guard/compaction", params=op)
plugins = client.get("/api/dashboard/plugins", headers=auth)
page = client.get("/dashboard-plugins/session-guard/dist/index.js")
print(json.dumps({
    "search_status": found.status_code,
    "sessions": sorted({r.get("session_id") for r in found.json().get("results", [])}),
    # an unknown path may answer the dashboard's page (200, HTML): the route is there only if JSON comes back
    "guard_route": status.status_code == 200 and "json" in status.headers.get("content-type", ""),
    "guard": status.json() if "json" in status.headers.get("content-type", "") else None,
    "guard_loaded": "hermes_session_guard" in sys.modules,
    "messages_status": shown.status_code,
    "messages": [str(m.get("content") or "") for m in (shown.json().get("messages") or [])]
                if "json" in shown.headers.get("content-type", "") else None,
    "compactions": records.json() if "json" in records.headers.get("content-type", "") else None,
    "session_compactions": one.json() if "json" in one.headers.get("content-type", "") else None,
    "opened": opened.json() if "json" in opened.headers.get("content-type", "") else None,
    "opened_without_token": opened_without_token.status_code,
    "tabs": [p for p in plugins.json() if p.get("name") == "session-guard"] if plugins.status_code == 200 else None,
    "page": page.text if page.status_code == 200 else None,
}))
"""


def _dashboard(home: Path, query: str) -> dict[str, Any]:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    env.pop("HERMES_SESSION_ID", None)
    done = subprocess.run([sys.executable, "-c", DASHBOARD, query, SID], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(home))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_enable_puts_the_guard_in_the_dashboard_process_and_disable_takes_it_out(
        guard: Any, db: Any, llm: FakeLLMServer, home: Path) -> None:
    messages = probe.seed_messages()
    messages[9]["content"] = f"Deploy failed on node-7 with {TOKEN}, OPENAI_API_KEY={KEY}. " + messages[9]["content"]
    probe.seed_session(db, SID, messages)
    agent = new_agent(db, llm, SID, "in_place")
    probe.mark_flushed(agent, messages)
    agent._compress_context(messages, "You are a test agent.", approx_tokens=150_000)
    live = [m.get("content") or "" for m in db.get_messages_as_conversation(SID)]
    assert not any(TOKEN in text for text in live)  # the turn was compacted away from the live transcript
    needs_seam = guard.seam_patched("search_messages")  # 0.13-0.17: only the guard's search reaches it

    enabled = run_cli(["enable", "--json"], home)
    assert enabled.returncode == 0, enabled.stderr
    plugin = Path(json.loads(enabled.stdout)["dashboard_plugin"])
    assert plugin == dashboard_plugin.plugin_dir(home)
    assert not (plugin / "plugin.yaml").exists()  # not an agent plugin: Hermes's discovery passes over it
    assert stat.S_IMODE(os.stat(plugin / "dashboard" / "api.py").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(plugin).st_mode) == 0o700

    on = _dashboard(home, TOKEN)
    assert on["guard_loaded"] and on["guard_route"] and on["guard"]["guard"] == "on"
    # the dashboard's session view: the conversation's live turns, no compaction summary
    assert on["messages_status"] == 200 and on["messages"], on["messages"]
    assert not any(is_summary_text(text) for text in on["messages"]), on["messages"]
    assert ("search_messages" in on["guard"]["patched"]) == needs_seam
    assert on["search_status"] == 200 and on["sessions"] == [SID]
    # the "Compactions" tab: listed by the dashboard, its page served, its route the guard's records
    (op,) = [c["op_id"] for c in guard.store_for(home / "state.db").compressions(SID)]
    for listed in (on["compactions"], on["session_compactions"]):
        assert listed["guard"] == "on" and [(c["session_id"], c["op_id"], c["outcome"]) for c in
                                            listed["compactions"]] == [(SID, op, "done")], listed
    (record,) = on["compactions"]["compactions"]
    assert record["messages_after"] < record["messages_before"] and record["snapshot_id"].startswith(SID)
    assert TOKEN not in json.dumps(on["compactions"])
    # a compaction opened: the original turns it replaced, from its snapshot, the key masked; the
    # dashboard's session token guards the route as every plugin route
    opened = on["opened"]
    assert opened["compaction"]["op_id"] == op and on["opened_without_token"] == 401
    turns = {t["turn"]: t["content"] for t in opened["turns"]}
    assert opened["first_turn"] <= 10 <= opened["last_turn"] == max(turns) and TOKEN in turns[10], turns.get(10)
    # masked by the guard's rules ([REDACTED]) or Hermes's pass (***), whichever reaches it first
    assert re.search(r"OPENAI_API_KEY=(\[REDACTED\]|\*\*\*)", turns[10]) and KEY not in json.dumps(opened)
    assert not any("turn-46:" in text for text in turns.values())  # kept by the compaction, not replaced
    (tab,) = on["tabs"]
    assert tab["label"] == "Compactions" and not tab["tab"].get("hidden"), tab
    assert on["page"] == dashboard_plugin.SCRIPT_SOURCE and 'register("session-guard"' in on["page"]

    disabled = run_cli(["disable", "--json"], home)
    assert disabled.returncode == 0, disabled.stderr
    assert json.loads(disabled.stdout)["dashboard_plugin_removed"] == str(plugin) and not plugin.exists()
    off = _dashboard(home, TOKEN)
    assert not off["guard_loaded"] and not off["guard_route"]
    assert any(is_summary_text(text) for text in off["messages"] or []), off["messages"]  # Hermes as shipped
    assert off["sessions"] == ([] if needs_seam else [SID])  # Hermes as shipped


def test_a_dashboard_on_a_home_that_does_not_enable_the_guard_stays_unguarded(home: Path) -> None:
    dashboard_plugin.write(home)
    probe.write_config(home, "http://127.0.0.1:9/v1", plugin_enabled=False)
    off = _dashboard(home, TOKEN)
    if off["guard_loaded"]:  # 0.13-0.17 import every dashboard plugin's api: it leaves the guard off
        assert off["guard_route"] and off["guard"] == {"guard": "off", "patched": []}
    else:  # 0.18+ import a user plugin's api only when plugins.enabled names it
        assert not off["guard_route"]
