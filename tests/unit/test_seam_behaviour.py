"""Seam behaviour is typed: enums for strategies, policies and states, a frozen
dataclass per row, read by attribute; the words stay what logs and JSON always showed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hermes_session_guard.runtime import SeamStatus
from hermes_session_guard.seam_behaviour import (
    Behaviour,
    FailurePolicy,
    FlushCursor,
    GatewayTranscript,
    LockMode,
    SeamKind,
    SeamState,
    Strategy,
    field_type,
)
from hermes_session_guard.seams import table as seams
from hermes_session_guard.seams.compression import LockPolicy


def test_every_field_has_a_type() -> None:
    assert all(isinstance(field_type(f.name), type) for f in dataclasses.fields(Behaviour))
    assert field_type("strategy") is Strategy and field_type("lease_table") is str


def test_words_become_typed_values() -> None:
    b = Behaviour.of({"strategy": "host_in_place", "flush_cursor": "marker", "lock": "native"})
    assert b.strategy is Strategy.HOST_IN_PLACE and b.flush_cursor is FlushCursor.MARKER
    assert b.lock is LockMode.NATIVE and b.transcript_order is None
    assert Behaviour.of(b) is b


def test_an_unknown_key_or_value_is_refused() -> None:
    with pytest.raises(TypeError):
        Behaviour.of({"strategyy": "detach_db"})
    with pytest.raises(ValueError):
        Behaviour.of({"strategy": "rotate"})


def test_behaviour_is_frozen_and_says_what_it_sets() -> None:
    b = Behaviour.of({"transcript": "offset"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.transcript = GatewayTranscript.HOST  # type: ignore[misc]
    assert b.set_values() == {"transcript": "offset"} and b.lock is None
    assert b == Behaviour.of({"transcript": "offset"}) and hash(b) == hash(Behaviour.of({"transcript": "offset"}))
    merged = b.merged({"lock": "native"})
    assert merged.set_values() == {"transcript": "offset", "lock": "native"} and merged.lock is LockMode.NATIVE
    assert b.lock is None  # the original is unchanged


def test_enum_values_print_and_serialise_as_their_words() -> None:
    assert Strategy.DETACH_DB == "detach_db" and Strategy.HOST_IN_PLACE == "host_in_place"
    assert f"{SeamState.NOT_NEEDED}" == "not-needed" and str(FailurePolicy.CLOSED) == "closed"
    status = SeamStatus("compression", "m:f", SeamState.PATCHED, "why", FailurePolicy.CLOSED, ">=0.13.0,<0.20.0")
    assert json.dumps(status.as_dict()) == (
        '{"name": "compression", "target": "m:f", "state": "patched", "reason": "why", "failure_policy": "closed",'
        ' "row": ">=0.13.0,<0.20.0"}')
    assert SeamKind.INSTANCE_SHIM == "instance shim"


@pytest.mark.parametrize("row", seams.SEAMS, ids=lambda r: f"{r.seam}{r.range_text}")
def test_every_row_holds_typed_values(row: seams.SeamRow) -> None:
    assert isinstance(row.behaviour, Behaviour)
    assert isinstance(row.failure_policy, FailurePolicy)
    assert isinstance(row.kind, SeamKind)
    for name, value in row.behaviour.set_values().items():
        assert isinstance(value, field_type(name))


def test_compression_rows_read_by_attribute() -> None:
    row = seams.select_row("compression", (0, 19, 0))
    assert row is not None
    assert (row.behaviour.strategy, row.behaviour.flush_cursor, row.behaviour.lock) == (
        Strategy.HOST_IN_PLACE, FlushCursor.MARKER, LockMode.NATIVE)
    assert row.behaviour.lock_failure is FailurePolicy.CLOSED
    assert LockPolicy().mode == "guard" and LockPolicy().on_failure is FailurePolicy.CLOSED


def test_a_row_written_with_words_is_typed() -> None:
    row = seams.SeamRow(seam="demo", since=(0, 13, 0), until=(0, 20, 0), module="m", attribute="f", params=("a",),
                        wrapper=None, failure_policy="open", behaviour={"strategy": "detach_db"})  # type: ignore[arg-type]
    assert row.failure_policy is FailurePolicy.OPEN and row.behaviour.strategy is Strategy.DETACH_DB
