"""Names in hermes_session_guard that vulture reports as unused although something it
cannot see reads or calls them. Passed to vulture with the package (the lint suite,
scripts/matrix.py run_lint; paths and confidence in pyproject.toml [tool.vulture]):

    python -m vulture

Each line names one attribute, method, variable or parameter; vulture counts a name as
used wherever it occurs, so ``_.name`` covers it in every module. A name belongs here
only when a framework or Hermes uses it, or (for the selftest harness, which ships in the
package) the tests and scripts; code that nothing uses is removed instead.
"""


class _Whitelist:
    def __getattr__(self, _name: str) -> None:
        return None


_ = _Whitelist()

# The standard library calls these by name.
_.do_GET  # http.server: BaseHTTPRequestHandler dispatches each method to do_<METHOD> (selftest/fake_llm.py)
_.do_POST
_.log_message  # http.server: overridden to keep the fake LLM quiet
_.protocol_version  # http.server: class attributes the handler and server read
_.server_version
_.sys_version
_.close_connection
_.daemon_threads  # socketserver: class attributes of the threading server
_.allow_reuse_address
_.row_factory  # sqlite3.Connection: rows as sqlite3.Row
_.fullname  # importlib: the MetaPathFinder.find_spec(fullname, path, target) protocol (seams/apply.py)
_.__signature__  # inspect.signature: a wrapper shows the signature of what it wraps (host/delivery.py, engine_shim.py)

# Other libraries read these by name.
_.preserve_quotes  # ruamel.yaml: YAML() settings (maintenance/plugin_config.py)
_.width

# Hermes reads these: attributes of its agent, gateway runner and modules that the guard
# and the selftest harness set, and methods of its platform adapter interface.
_._session_db_created  # AIAgent (host/handoff.py, selftest/probe.py)
_._last_flushed_db_idx  # AIAgent's flush cursor (host/persistence.py, host/handoff.py, selftest/probe.py)
_._hermes_home  # gateway.run module global, computed at import (selftest/gateway.py)
_.DEFAULT_DB_PATH  # hermes_state module global, computed at import (selftest/gateway.py)
_._gateway_loop  # GatewayRunner (selftest/gateway.py)
_.disconnect  # BasePlatformAdapter interface (selftest/gateway.py FakeAdapter)
_.send_typing
_.get_chat_info
_.edit_message
_.reply_to  # BasePlatformAdapter.send(chat_id, content, reply_to, metadata) parameter

# Hermes's dashboard imports the plugin's api.py (written by `enable`), which calls this.
_.activate  # dashboard_plugin.activate

# Dataclass fields read through as_dict() (asdict or __dict__) and printed or emitted as JSON.
_.engine_class  # host/engines.py EngineSupport: `selftest` prints it
_.context_source  # maintenance/session_pressure.py Thresholds: `status` prints them
_.agent_percent
_.hermes_version

# Record fields built positionally from a SELECT of every column of their table.
_.buffered_at  # inbox/repository.py InboxEntry
_.delivered_at
_.updated_at  # store/generations.py GenerationRecord
_.finished_at  # store/handoffs.py HandoffRecord

# Enum members the seam table names by value ("index", "guard", ...) and the code never
# names by attribute (seam_behaviour.py).
_.INDEX  # FlushCursor
_.IDENTITY
_.ID  # TranscriptOrder
_.TIMESTAMP
_.COPY  # SnapshotStorage
_.GUARD  # LockMode
_.NATIVE
_.OPEN  # FailurePolicy
_.NONE
_.HEADER  # SessionFrom

# The selftest harness ships in the package (`selftest`, `demo` and the recall eval run from an
# installed wheel); these parts of it are used by the tests and scripts/ only.

_.wait_for_requests  # selftest/fake_llm.py: tests and scripts/make_corrupt_fixtures.py
_.say  # selftest/gateway.py GatewayHarness: send and wait (integration tests, scripts/make_corrupt_fixtures.py)
_.TARGET  # selftest/recall_eval.py: run by scripts/eval_recall.py (check_dist runs it from the wheel)
_.write_eval_config
_.run_recall_eval
_.outside
_.last_completion_tokens  # host/agent.py await_real_usage: Hermes's compressor attribute, reset as Hermes does
_.__class__  # seams/buffering.py defer_cli_interrupts: switches the CLI queue's class in place
_.maxlevel  # config.py _SHOW: reprlib.Repr's limits, read by reprlib
_.maxlist
_.maxstring
_.maxother
_.maxdict
