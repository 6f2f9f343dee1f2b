"""Everything the guard knows about Hermes's internals, by area.

This package and :mod:`hermes_session_guard.seams` are the only parts that know Hermes's
internals (``tests/integration/host_names.py`` lists the Hermes names they rely on,
checked against each release). The rest of the package imports
``from . import host`` and calls ``host.<name>``; every such name is imported here (the
imports are the list: ruff's unused-import rule is off for this file only).

- :mod:`.markers`: compaction-summary markers
- :mod:`.agent`: an AIAgent's session, SessionDB, tools, notifications
- :mod:`.engine_shim`: the context-engine ``compress`` shim
- :mod:`.persistence`: writing a compacted transcript, the flush cursor
- :mod:`.leases`: Hermes's native compression lock
- :mod:`.turn_leases`: Hermes's native turn lease (0.20+)
- :mod:`.reads`: read-only recall queries on state.db
- :mod:`.delivery`: the platform-adapter ``send``/``edit_message``/``send_draft`` shim
- :mod:`.statedb`: state.db SQL and SessionDB writes for the operator commands
- :mod:`.handoff`: creating and switching to a hand-off child session
- :mod:`.routing`: the gateway's chat-to-session routing
- :mod:`.events`: gateway MessageEvents and their payloads
- :mod:`.gateway`: the runner and adapters for the buffering seams
- :mod:`.api_server`: which state.db an API server request reads
- :mod:`.engines`: which promises hold for the active context engine
- :mod:`.facts`: small facts off the installed release for the operator commands
- :mod:`.rules`: the release's compression rules (defaults, thresholds) for doctor and status
- :mod:`.toolsets`: the background plugin-discovery thread and toolset resolution (0.20)
"""

from __future__ import annotations

from .agent import (
    await_real_usage,
    commit_failed_since,
    commit_memory,
    compacted_in_place,
    context_engine,
    current_system_prompt,
    db_path,
    detached_session_db,
    emit_status,
    failure_cooldown_class,
    failure_cooldown_mark,
    forced_in_place,
    mark_compacted_in_place,
    notify_boundary,
    persistence_disabled,
    pinned_log_context,
    serves_api_server,
    session_db,
    session_id,
    system_prompt_of,
    todo_items,
    tool_names,
    tools_hidden,
)
from .api_server import request_db_path
from .dashboard import dashboard_app, shim_dashboard, unshim_dashboards
from .delivery import (
    json_response_like,
    shim_adapter,
    unshim_adapters,
)
from .engine_shim import (
    shim_engine,
    unshim_engines,
    watching_engine,
)
from .events import (
    INBOX_TAG,
    event_chat_id,
    event_from_payload,
    event_inbox_seq,
    event_is_plain_message,
    event_payload,
    event_platform,
    event_text,
    event_user_id,
)
from .gateway import (
    adapter_busy,
    adapter_for,
    adapter_for_platform,
    adapter_has_pending,
    approval_pending,
    gateway_session_id,
    platform_value,
    redeliver,
    runner_db_path,
    runner_draining,
    runner_lock_holder,
    runner_session_db,
    running_agent_session_id,
    send_notice,
    session_key_for,
    session_running,
    stage_pending,
    transcript_has_user_text,
    user_authorized,
)
from .handoff import (
    carry_turn_lease,
    create_child_session,
    discard_session,
    git_state,
    host_redactor,
    new_session_id,
    notify_handoff,
    release_carried_turn_leases,
    session_messages,
    session_row,
    switch_agent_session,
    working_dir,
)
from .leases import (
    NativeLeases,
    clear_expired_native_lock,
    native_leases,
    native_lock_held_here,
    native_lock_reentry,
)
from .markers import (
    NATIVE_SUMMARY_KEY,
    carries_summary_marker,
    merged_summary_markers,
    summary_prefixes,
)
from .persistence import (
    append_messages,
    carried_unpersisted,
    live_brief,
    live_brief_and_runs,
    live_transcript,
    persist_compacted,
    rebase_flush,
    staged_turn_row,
)
from .reads import (
    close_readers,
    compression_ancestors,
    last_row_id,
    live_row_ranges,
    referenced_messages,
    rows_by_runs,
    runs_of,
    stored_message,
    stored_messages,
    stored_turns,
)
from .routing import (
    RoutingMove,
    current_conversation_session,
    gateway_message_context,
    gateway_routes_to,
    gateway_send,
    live_gateway_runner,
    move_gateway_routing,
)
from .statedb import (
    COMPRESSION_END_REASON,
    NATIVE_LOCK_TABLE,
    NON_CONTINUATION_MARKERS,
    REQUIRED_COLUMNS,
    ROUTING_FILE,
    as_message,
    end_session,
    ensure_session_row,
    gateway_running,
    host_schema_version,
    is_live_row,
    open_session_db,
    read_message_marks,
    read_message_stats,
    read_routing_file,
    read_routing_table,
    read_schema_version,
    read_session_rows,
    read_sessions,
    read_summary_rows,
    read_system_prompt,
    reopen_session,
    routing_file_entries,
    save_routing_entry,
    session_db_for,
    session_exists,
    set_live_transcript,
    table_columns,
    update_system_prompt,
    write_routing_file,
)
from .toolsets import discovered_in_background, discovering_in_background, platform_toolsets
from .turn_leases import HostTurnLeases, host_turn_leases, in_host_turn
