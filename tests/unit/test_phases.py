"""The response phases (`middleware.phases`): the transitions a response can take, and
that any other raises instead of passing silently."""

from __future__ import annotations

import pytest

from middleware.phases import Phase, PhaseError, step

ALLOWED = {
    (Phase.START, Phase.PLAIN),
    (Phase.START, Phase.HEADERS),
    (Phase.PLAIN, Phase.DONE),
    (Phase.HEADERS, Phase.BODY),
    (Phase.HEADERS, Phase.DONE),
    (Phase.BODY, Phase.DONE),
}


@pytest.mark.parametrize("current", list(Phase))
@pytest.mark.parametrize("to", list(Phase))
def test_only_the_machine_s_transitions_are_taken(current: Phase, to: Phase) -> None:
    """A stream goes START → HEADERS → BODY → DONE (or ends before its first body byte), a
    plain response START → PLAIN → DONE; anything else, DONE onwards included, raises."""
    if (current, to) in ALLOWED:
        assert step(current, to) is to
    else:
        with pytest.raises(PhaseError):
            step(current, to)
