"""`bench.lab.profile`: its reading of py-spy's collapsed stacks, and its arguments, which it
checks before it starts anything."""

from __future__ import annotations

import pytest

from bench.lab.profile import main, top


def test_self_samples_go_to_the_innermost_frame_and_totals_to_every_frame_once() -> None:
    """Rule: a stack's samples count as self time for its last frame only, and as total time
    for each distinct frame on it, once even where a frame recurs; a frame is its function and
    its file's name, with or without a directory."""
    collapsed = "\n".join(
        [
            "run (/usr/lib/asyncio/loop.py:1);relay (middleware/relay.py:5) 3",
            "run (/usr/lib/asyncio/loop.py:1);relay (middleware/relay.py:5);relay (relay.py:5) 1",
            "run (/usr/lib/asyncio/loop.py:1) 6",
            "not a stack line",
        ]
    )
    lines = top(collapsed).splitlines()
    assert lines[0] == "10 samples"
    rows = {line.split(None, 2)[2]: line.split()[:2] for line in lines[2:]}
    assert rows["run loop.py"] == ["60.0", "100.0"]
    assert rows["relay relay.py"] == ["40.0", "40.0"]


@pytest.mark.parametrize(
    "argv",
    [["steady"], ["paced", "soon"], ["paced", "5", "--target", "nginx"]],
    ids=["unknown scenario", "seconds not a number", "not a sidestream target"],
)
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: an unknown scenario, a duration that is not a number or a target that is not
    sidestream's ends with a usage error (exit status 2) naming the argument, before any
    process is started."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    assert "invalid" in capsys.readouterr().err
