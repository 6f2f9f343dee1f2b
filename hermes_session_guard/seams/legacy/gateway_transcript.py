"""Keep the gateway's own transcript bookkeeping in step with an id-preserving compaction.

Up to 0.17 Hermes's gateway slices a turn's new messages at ``len(history)``, and
0.13-0.14 also keep a JSONL copy of every transcript next to state.db and, on the
next message, load whichever of the two is longer: both assume that a compaction
always moved the conversation to a new session (0.18.2+ re-baselines by itself
on ``agent._last_compaction_in_place``). When the guard keeps the id, the
gateway-turn seam's rows of 0.13-0.17 name :func:`gateway_turn_wrapper`, the gateway turn's
wrapper (:func:`..gateway.gateway_turn_wrapper`) calling :func:`rebase_after_compaction` after the
turn so that

* the JSONL transcript of the live id holds the compacted transcript (the
  verbatim history is in the guard's snapshot), and
* ``history_offset`` points just past the compacted transcript, so the gateway
  appends exactly the turn's new messages (and does not write its fallback
  user/assistant pair into state.db a second time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...contract.compaction_log import Compaction
from ...files import atomic_write_text
from ...runtime import Runtime
from ...seam_behaviour import GatewayTranscript
from .. import gateway
from ..row import SeamRow, Wrapper


def rewrite_jsonl(path: Path, messages: tuple[dict[str, Any], ...]) -> None:
    """Atomically replace a JSONL transcript (:func:`~hermes_session_guard.files.atomic_write_text`)."""
    # the replacement keeps the transcript's owner and mode (0600 for a new one)
    atomic_write_text(path, "".join(json.dumps(msg, ensure_ascii=False, default=str) + "\n" for msg in messages))


def rebase_after_compaction(
    session_store: Any, session_id: str, compaction: Compaction, result: Any, *, jsonl: bool = True
) -> None:
    keep = len(compaction.compacted)
    messages = result.get("messages") if isinstance(result, dict) else None
    if isinstance(messages, list):
        keep = min(keep, len(messages))
        if keep and keep == len(messages) and (messages[keep - 1] or {}).get("role") == "user":
            # The turn produced nothing after the compaction (empty reply, interruption):
            # the gateway then records the turn's user message itself when it finds no
            # new messages, a second time in state.db. Count it as this turn's message.
            keep -= 1
    path_fn = getattr(session_store, "get_transcript_path", None) if jsonl else None
    if callable(path_fn):
        path = Path(path_fn(session_id))
        if path.exists():
            rewrite_jsonl(path, compaction.compacted[:keep])
    if isinstance(messages, list):
        result["history_offset"] = keep


def rebase_transcript(runtime: Runtime, row: SeamRow, runner: Any, sid: str, mark: int, result: Any) -> None:
    """After a gateway turn (``mark``: the compaction log's mark before it): the compaction
    the guard made of ``sid`` meanwhile, if any, re-bases the gateway's transcript
    bookkeeping (``transcript``: ``jsonl_and_offset`` on 0.13-0.14, ``offset`` on 0.15-0.17).
    After a hand-off fork the turn belongs to the child, and the host's own split handling
    already writes it whole (history offset 0)."""
    compaction = runtime.compactions.since(sid, mark)
    if compaction is not None:
        forked = runtime.compactions.fork_since(sid, mark) is not None
        rebase_after_compaction(runner.session_store, sid, compaction, None if forked else result,
                                jsonl=row.behaviour.transcript == GatewayTranscript.JSONL_AND_OFFSET)


def gateway_turn_wrapper(runtime: Runtime, row: SeamRow) -> Wrapper:
    """``GatewayRunner._run_agent`` on 0.13-0.17: the gateway turn's wrapper, which re-bases the
    gateway's transcript after a compaction the guard made in place (:func:`rebase_transcript`)."""
    return gateway.gateway_turn_wrapper(runtime, row, rebase=rebase_transcript)
