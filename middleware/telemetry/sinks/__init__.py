"""Where a stream's summary goes: each output of telemetry is one sink.

- `span` (`sinks.span`): the stream's span, its attributes, events and status, and its end;
- `metrics` (`sinks.metrics`): the GenAI and sidestream metrics (Prometheus text, OTLP);
- `access` (`sinks.access`): the JSON access line.

All three are on by default. `Telemetry(sinks={"metrics", "access"})` leaves one out;
`Telemetry.from_env` reads `SIDESTREAM_TELEMETRY_SINKS` (`parse_sinks`). A sink left out costs
nothing: without `span` no span is even started (and none is propagated upstream). The access
line is for streams and GenAI calls; `Telemetry(access_all=True)` (`from_env`:
`SIDESTREAM_TELEMETRY_ACCESS_ALL=on`, `parse_switch`) writes one for every request.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

SINKS: Final = frozenset({"span", "metrics", "access"})


def chosen_sinks(names: Collection[str]) -> frozenset[str]:
    """`names` as the set of sinks in use; a name not in `SINKS` is an error."""
    if isinstance(names, str):  # one name, not its letters
        names = (names,)
    unknown = sorted(set(names) - SINKS)
    if unknown:
        known = ", ".join(sorted(SINKS))
        raise ValueError(f"unknown telemetry sink {', '.join(unknown)} (known: {known})")
    return frozenset(names)


def parse_sinks(value: str | None) -> frozenset[str]:
    """`SIDESTREAM_TELEMETRY_SINKS`: sink names separated by commas (`span,metrics,access`),
    `none` for none; unset or empty, all of them."""
    if value is None or not value.strip():
        return SINKS
    names = {name.strip().lower() for name in value.split(",") if name.strip()}
    if names == {"none"}:
        return frozenset()
    try:
        return chosen_sinks(names)
    except ValueError as error:
        raise ValueError(f"SIDESTREAM_TELEMETRY_SINKS={value!r}: {error}") from None


# The access sink's one setting: a line for every request, other traffic too (`kinds`).
ACCESS_ALL: Final = "SIDESTREAM_TELEMETRY_ACCESS_ALL"
_SWITCH = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False}
_SWITCH |= {"no": False, "off": False, "": False}


def parse_switch(name: str, value: str | None) -> bool:
    """An on/off variable (`on`, `off`, and true/false, yes/no, 1/0); unset is off. Anything
    else is an error at start, not a setting silently ignored."""
    switch = _SWITCH.get((value or "").strip().lower())
    if switch is None:
        raise ValueError(f"{name}={value!r}: expected on or off (or true/false, yes/no, 1/0)")
    return switch
