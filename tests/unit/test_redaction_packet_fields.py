"""Redaction of a packet's fields: the assistant's reply is redacted whole before it is
cut into open questions, Hermes's pass runs line by line on bounded text (it can neither
delete a section nor see an unbounded token), and a value masked with its context is
masked wherever it is echoed bare."""

from __future__ import annotations

import re
from typing import Any

from hermes_session_guard.handoff import redaction
from hermes_session_guard.handoff.packet import (
    CLIP_MARGIN,
    MAX_NOTE_CHARS,
    PacketInputs,
    open_questions,
    render_packet,
    session_secret_values,
)
from hermes_session_guard.handoff.redaction import MASK, host_pass, mask_known, masked_values

SECTIONS = ["## Note", "## Last user request", "## Todo list", "## Latest summary", "## Open questions", "## Recall"]
JWT = ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
SENDGRID = "SG.Zx9Yw8Vu7Ts6Rq5Po4Nm3L.k2Jh1Gf0Ed9Cb8Av7Uz6Ty5Xw4Vs3Rr2Qq1Pp0"
DISCORD = "MTEyMzQ1Njc4OTAxMjM0NTY3OA.GhIjKl.abcdefghijklmnopqrstuvwxyz0123456789AB"


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def test_open_questions_are_cut_from_a_redacted_reply() -> None:
    """Cut at ``.`` before redaction, a dotted secret's tail arrived alone and unmasked."""
    reply = (f"Should I keep {JWT} as the test token? Is {SENDGRID} the key for staging? "
             f"Do you want {DISCORD} in the bot config? The password is Tr0ub4dor.Xy9Kq2Lm7, should I keep it?")
    questions = open_questions(None, [{"role": "user", "content": "hi"}, _assistant(reply)])
    assert len(questions) == 4
    joined = "\n".join(questions)
    for tail in ("SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "k2Jh1Gf0Ed9Cb8Av7Uz6Ty5Xw4Vs3Rr2Qq1Pp0",
                 "abcdefghijklmnopqrstuvwxyz0123456789AB", "Xy9Kq2Lm7"):
        assert tail not in joined, joined
    packet = render_packet(PacketInputs(session_id="S", created_at=0.0, open_questions=questions))
    assert "SflKxwRJ" not in packet and "k2Jh1Gf0" not in packet


def _greedy_url_rule(text: str) -> str:
    """Hermes 0.14's connection-string rule: ``[^:]+`` and ``[^@]+`` run over line ends."""
    return re.sub(r"((?:postgres(?:ql)?|mysql)://[^:]+:)([^@]+)(@)", r"\1***\3", text)


def test_hermes_pass_never_removes_a_section() -> None:
    """A URL with credentials in the note and the last request: the host's rule used to
    delete from the first one to the second, the "Last user request" heading included."""
    url = "postgres://app:Sup3rPa55w0rd@db.internal:5432/app"
    inputs = PacketInputs(session_id="S", created_at=0.0, note=f"connect with {url} please",
                          last_user_request=f"then run the migration against {url}, ok: go",
                          summary="## Goal\nship it: today")
    packet = render_packet(inputs, _greedy_url_rule)
    for heading in SECTIONS[:-1]:
        assert heading in packet, packet
    assert "Sup3rPa55w0rd" not in packet
    assert "then run the migration" in packet


def test_hermes_pass_sees_bounded_pieces_only() -> None:
    seen: list[int] = []

    def host(text: str) -> str:
        seen.append(len(text))
        return text

    token = "A1b2C3d4" * 30_000  # a 240 KB single token
    host_pass(token + "\nnext line", host)
    assert seen and max(seen) <= redaction.HOST_PASS_MAX_LINE
    assert sum(seen) <= redaction.HOST_PASS_MAX_CHARS
    seen.clear()
    render_packet(PacketInputs(session_id="S", created_at=0.0, note=token, last_user_request=token,
                               summary=token, title=token, open_questions=[token + "?"],
                               todos=[{"id": "1", "content": token, "status": "pending"}]), host)
    assert max(seen) <= redaction.HOST_PASS_MAX_LINE
    assert sum(seen) <= 2 * (MAX_NOTE_CHARS + CLIP_MARGIN) * 10  # every field bounded before the host pass


def test_a_value_seen_with_its_context_is_masked_where_it_is_echoed() -> None:
    messages = [{"role": "user", "content": "set DB_PASSWORD=Qx7mK2pL9vR4 in the env"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "and also try Qx7mK2pL9vR4 on the replica"}]
    known = session_secret_values(messages)
    assert "Qx7mK2pL9vR4" in known
    packet = render_packet(PacketInputs(session_id="S", created_at=0.0, secret_values=known,
                                        last_user_request=messages[-1]["content"]))
    assert "Qx7mK2pL9vR4" not in packet and "on the replica" in packet


def test_a_value_in_one_field_is_masked_when_another_field_echoes_it() -> None:
    packet = render_packet(PacketInputs(session_id="S", created_at=0.0, note="api_key: Zk4nR8vT2wQ6yP0s",
                                        last_user_request="is Zk4nR8vT2wQ6yP0s right?"))
    assert "Zk4nR8vT2wQ6yP0s" not in packet


def test_masked_values_are_what_each_mask_stands_for() -> None:
    text = "PASSWORD=Abc123xyz9 and token: 'Zz9Yy8Xx7Ww6' then https://bob:Ur1Pa55wordX@git.example.com/r"
    assert {"Abc123xyz9", "Zz9Yy8Xx7Ww6"} <= masked_values(text)
    assert not masked_values("nothing secret here")
    assert mask_known("x Abc123xyz9 y", frozenset({"Abc123xyz9"})) == f"x {MASK} y"
