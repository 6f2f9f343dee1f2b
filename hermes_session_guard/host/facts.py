"""Small facts read off the installed Hermes for the operator commands.

Kept apart from the adapter so ``maintenance/`` and ``commands/`` ask here instead of
importing Hermes modules themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..fail_open import failing_open


def _rough_estimate(messages: list[Any]) -> int:
    return (sum(len(str(m)) for m in messages) + 3) // 4


def token_estimator() -> Callable[[list[Any]], int]:
    """Hermes's own rough token estimate of a message list (``agent.model_metadata``), or
    the same four-characters-a-token rule when this release has none."""
    with failing_open("importing agent.model_metadata's token estimate", "four characters count as a token",
                      level=logging.DEBUG, advice=None):
        from agent.model_metadata import estimate_messages_tokens_rough

        estimate: Callable[[list[Any]], int] = estimate_messages_tokens_rough
        return estimate
    return _rough_estimate


def session_db_missing() -> str | None:
    """Why Hermes's ``hermes_state`` (its SessionDB) cannot be imported here, or None."""
    try:
        import hermes_state  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None
