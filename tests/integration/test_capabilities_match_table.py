"""On every release installed here, the behaviour a seam would get from what Hermes has
(seams/capabilities.py, used on releases outside the table) is the table's row for the release:
the capability rules reproduce every tested choice, the compression strategy first."""

from __future__ import annotations

import pytest

from hermes_session_guard.hostinfo import parse_version
from hermes_session_guard.seams import capabilities
from hermes_session_guard.seams.apply import verify_row
from hermes_session_guard.seams.table import SEAMS, fallback_rows, select_row

from .conftest import HERMES_VERSION

pytestmark = pytest.mark.host

BEHAVIOUR_SEAMS = sorted({row.seam for row in SEAMS if capabilities.derive(row.seam, capabilities.Capabilities())
                          or row.behaviour.set_values()})


def test_the_compression_row_chosen_by_capabilities_is_the_table_s() -> None:
    caps = capabilities.detect()
    row = select_row("compression", parse_version(HERMES_VERSION))
    assert row is not None
    derived = capabilities.derive("compression", caps)
    assert capabilities.matches(row, derived), (caps, row.behaviour, derived)
    # the first candidate whose target verifies here is that very row
    chosen = next(r for r in capabilities.choose_rows("compression", fallback_rows("compression"), caps)
                  if verify_row(r) is None)
    assert chosen == row


@pytest.mark.parametrize("seam", BEHAVIOUR_SEAMS)
def test_every_behaviour_seam_s_derived_behaviour_is_the_table_s(seam: str) -> None:
    row = select_row(seam, parse_version(HERMES_VERSION))
    if row is None:
        pytest.skip(f"no {seam} row for {HERMES_VERSION}")
    caps = capabilities.detect()
    assert capabilities.matches(row, capabilities.derive(seam, caps)), (caps, row.behaviour)
    assert row in capabilities.choose_rows(seam, fallback_rows(seam), caps)
