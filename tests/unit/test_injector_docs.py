"""docs/kubernetes.md's annotation table is the injector's: every annotation the injector
reads has a row with a default and a range, and no row names one it does not read."""

from __future__ import annotations

import re
from pathlib import Path

from sidecar.injector.settings import KNOWN

DOC = Path(__file__).parents[2] / "docs" / "kubernetes.md"


def annotation_rows() -> dict[str, list[str]]:
    """annotation name -> its row's cells, from the table under "### Annotations"."""
    text = DOC.read_text().split("### Annotations", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("annotation", "---"):
            continue
        for name in re.findall(r"`([a-z-]+)`", cells[0]):
            rows[name] = cells
    return rows


def test_every_annotation_is_documented_with_its_default_and_range() -> None:
    """Rule: each `sidestream.dev/*` annotation the injector knows has a row in the table,
    with a default and a range (`status`, written by the injector, has neither)."""
    rows = annotation_rows()
    assert set(rows) == set(KNOWN)
    for name, (_, sets, default, allowed) in rows.items():
        assert sets, name
        if name != "status":
            assert default and allowed, f"{name}: default or range missing"
