"""The seeded conversation every probe, gateway scenario, demo and test starts from: at the
bottom of ``selftest/``, so the probe and the gateway harness both read it without importing
each other."""

from __future__ import annotations

from typing import Any

MESSAGE_CHARS = 14_000
SEED_MESSAGES = 48


def seed_messages(n: int = SEED_MESSAGES, chars: int = MESSAGE_CHARS, tag: str = "turn") -> list[dict[str, Any]]:
    """``n`` alternating user/assistant messages of ~``chars`` characters, each
    starting with a unique marker ``<tag>-<i>:`` so tests can find them."""
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        head = f"{tag}-{i}: "
        body = (f"{role} line {i} about the deployment plan. " * (chars // 40 + 1))[: max(0, chars - len(head))]
        out.append({"role": role, "content": head + body})
    return out
