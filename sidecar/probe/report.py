"""The probe's report: a table for people, JSON for scripts. Pure functions over checks."""

from __future__ import annotations

import json
import textwrap

from sidecar.probe.analysis import Check, Status

WIDTH = 100


def table(title: str, checks: list[Check]) -> str:
    """One row per check; a failed or warned check gets its fix under it."""
    name_width = max(len(c.name) for c in checks)
    lines = [title, ""]
    for check in checks:
        head = f"{check.name:<{name_width}}  {check.status.value.upper():<4}  "
        body = textwrap.wrap(check.detail, WIDTH - len(head)) or [""]
        lines.append(head + body[0])
        lines.extend(" " * len(head) + more for more in body[1:])
        if check.fix and check.status in (Status.FAIL, Status.WARN):
            fix = textwrap.wrap("fix: " + check.fix, WIDTH - len(head) - 2)
            lines.extend(" " * (len(head) + 2) + part for part in fix)
    failed = sum(c.status is Status.FAIL for c in checks)
    lines += ["", "healthy" if not failed else f"{failed} check(s) failed"]
    return "\n".join(lines)


def as_json(url: str, checks: list[Check]) -> str:
    return json.dumps(
        {
            "url": url,
            "healthy": not any(c.status is Status.FAIL for c in checks),
            "checks": [
                {
                    "name": c.name,
                    "status": c.status.value,
                    "detail": c.detail,
                    "fix": c.fix,
                    "data": c.data,
                }
                for c in checks
            ],
        },
        indent=2,
    )
