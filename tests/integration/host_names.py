"""The host surface: Hermes names the :mod:`hermes_session_guard.host` package relies on,
by area; the gateway and engine tests check that they resolve on each release."""

from __future__ import annotations

HOST_NAMES: dict[str, tuple[str, ...]] = {
    "AIAgent attributes": (
        "session_id",
        "_session_db",
        "compression_in_place",
        "_last_flushed_db_idx",
        "_flushed_db_message_ids",
        "_flushed_db_message_session_id",
        "context_compressor",
        "_memory_manager",
        "commit_memory_session",
        "_cached_system_prompt",
        "_build_system_prompt",
        "_last_compaction_in_place",
        "_repair_message_sequence",
    ),
    "AIAgent tool and prompt attributes": ("tools", "valid_tool_names"),
    "agent.context_compressor": (
        "SUMMARY_PREFIX", "LEGACY_SUMMARY_PREFIX", "_HISTORICAL_SUMMARY_PREFIXES", "_MERGED_PRIOR_CONTEXT_HEADER",
        "_MERGED_SUMMARY_DELIMITER",
    ),
    "ContextCompressor attributes": ("_last_summary_error", "_last_compress_aborted", "on_session_start"),
    # Any context engine, through the interface (engine_support decides what can be wrapped).
    "ContextEngine interface": ("name", "compress", "on_session_start", "on_session_end"),
    "context engine selection (engine_support, selftest)": (
        "config.yaml context.engine", "agent.context_engine.ContextEngine",
        "agent.context_compressor.ContextCompressor",
        "plugins.context_engine.load_context_engine", "hermes_cli.plugins.discover_plugins",
        "hermes_cli.plugins.get_plugin_context_engine",
    ),
    "SessionDB methods": (
        "db_path", "replace_messages", "update_system_prompt", "get_messages", "get_messages_as_conversation",
        "append_message", "get_session", "create_session", "delete_session", "end_session", "get_session_title",
        "set_session_title", "get_next_title_in_lineage",
    ),
    "SessionDB compression lock (0.16+; refresh 0.18.2+)": (
        "try_acquire_compression_lock", "refresh_compression_lock", "release_compression_lock",
        "get_compression_lock_holder",
    ),
    "state.db columns (recall index, read only)": (
        "sessions.id", "sessions.parent_session_id", "sessions.end_reason",
        "messages.id", "messages.session_id", "messages.role", "messages.content", "messages.active",
        "messages.compacted",
    ),
    "gateway.platforms.base": (
        "BasePlatformAdapter.send", "BasePlatformAdapter.edit_message", "SendResult", "MessageEvent", "MessageType",
    ),
    "transcript rows that are not turns": ("session_meta",),
    "hermes_logging": ("set_session_context", "_session_context"),
    # Operator commands (doctor, repair, status): read state.db read-only by SQL,
    # write only through these SessionDB methods.
    "state.db tables": ("sessions", "messages", "schema_version", "compression_locks", "gateway_routing"),
    "state.db columns": (
        "sessions.id", "sessions.source", "sessions.parent_session_id", "sessions.started_at",
        "sessions.ended_at", "sessions.end_reason", "sessions.model_config", "sessions.system_prompt",
        "messages.id", "messages.session_id", "messages.role", "messages.content", "messages.timestamp",
        "messages.active", "compression_locks.session_id", "compression_locks.holder",
        "compression_locks.acquired_at", "compression_locks.expires_at", "gateway_routing.scope",
        "gateway_routing.session_key", "gateway_routing.entry_json",
    ),
    "SessionDB repair methods": (
        "replace_messages", "archive_and_compact", "reopen_session",
        "end_session", "ensure_session", "update_system_prompt", "save_gateway_routing_entry",
        "try_acquire_compression_lock", "release_compression_lock",
    ),
    "hermes_state": ("SessionDB", "SCHEMA_VERSION"),
    "gateway.status": ("is_gateway_runtime_lock_active",),
    "gateway routing file": ("sessions/sessions.json",),
    "hand-off (agent)": (
        "model", "platform", "_session_init_model_config", "_cached_system_prompt", "_todo_store.read",
        "_emit_status", "status_callback", "session_log_file", "logs_dir", "_session_db_created",
        "_persist_disabled",
    ),
    "hand-off (host modules)": (
        "agent.redact.redact_sensitive_text", "gateway.session_context._SESSION_ID", "hermes_state.SessionDB",
        "hermes_cli.goals.migrate_goal_to_session",
    ),
    "hand-off (gateway)": (
        "gateway.run._gateway_runner_ref", "GatewayRunner.session_store", "GatewayRunner.adapters",
        "GatewayRunner._session_key_for_source", "SessionStore._entries", "SessionStore._lock", "SessionStore._save",
        "SessionStore._record_gateway_session_peer", "SessionEntry.session_id", "SessionEntry.origin",
        "SessionEntry.last_prompt_tokens", "MessageEvent.source",
    ),
    # Buffering during compression (busy-message, drain, hand-off and replay seams).
    "GatewayRunner attributes": (
        "session_store",
        "_running_agents",
        "_session_db",
        "_background_tasks",
        "_draining",
        "adapters",
        "_session_key_for_source",
        "_is_user_authorized",
        "_reply_anchor_for_event",
        "_thread_metadata_for_source",
    ),
    "GatewayRunner attributes used when present": ("_adapter_for_source",),
    "AsyncSessionDB attributes used when present (0.19 gateway)": ("_db",),
    "SessionStore attributes": ("_entries",),
    "BasePlatformAdapter attributes": (
        "_active_sessions",
        "_pending_messages",
        "_send_with_retry",
        "send",
        "handle_message",
    ),
    "gateway.session": ("SessionSource.to_dict", "SessionSource.from_dict"),
    "tools.approval": ("has_blocking_approval",),
    "SessionDB compression lock, read by the busy-message seam (0.16+)": ("get_compression_lock_holder",),
    # The recall tool's toolset and the CLI's toolset check (toolset_keys, agent_toolsets; 0.20).
    "background plugin discovery and toolset resolution (0.20)": (
        "hermes_cli.plugins._background_discovery_thread", "hermes_cli.plugins._persist_plugin_toolset_keys",
        "hermes_cli.tools_config._get_platform_tools", "hermes_cli.config.load_config",
    ),
}
