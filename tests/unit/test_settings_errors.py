"""One rule for a bad setting: exit status 2 and one line on stderr that names the setting
(the flag, and the variable when the value came from one) and the values it takes
(`expected …`), through `sidecar.config.load`, the parser's entry; for every flag of
`sidecar.config.FLAGS`, from the command line and from the environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import ENV_ONLY, FLAGS, SWITCHES, env_name, load

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ["--upstream", "http://127.0.0.1:1"]
# A value each flag refuses; "bogus" for the rest (a missing file for the file flags).
BAD = {
    "ready-file": "/nonexistent-directory/ready.json",
    "resume-credential-headers": "authorization,last-event-id",
    "upstream-health": "health",
}
VALUED = [
    flag for flag, *_ in FLAGS if flag not in SWITCHES and flag not in ("certfile", "keyfile")
]
TIMEOUTS = [flag for flag, *_ in FLAGS if flag.endswith("-timeout") or flag == "max-duration"]


def refusal(argv: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `load` exits 2 with (the test fails if it loads, or exits otherwise)."""
    with pytest.raises(SystemExit) as exited:
        load(argv, environ=environ)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # one line, no traceback
    assert lines[0].startswith("sidestream: error: ")
    return lines[0]


@pytest.mark.parametrize("flag", VALUED)
def test_a_bad_flag_value_is_one_line_naming_the_flag_and_what_it_takes(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: every valued flag with a bad value on the command line exits 2 with one line
    naming `--flag` and, after `expected`, the values it takes."""
    base = [] if flag == "upstream" else UPSTREAM
    line = refusal([*base, f"--{flag}", BAD.get(flag, "bogus")], {}, capsys)
    assert f"argument --{flag}: expected " in line


@pytest.mark.parametrize(
    "flag", [flag for flag, *_ in FLAGS if flag not in ("certfile", "keyfile")]
)
def test_a_bad_variable_is_one_line_naming_it_and_its_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: every `SIDESTREAM_*` variable of a flag, switches included, with a bad value exits
    2 with one line naming the variable, its flag and the values it takes."""
    base = [] if flag == "upstream" else UPSTREAM
    line = refusal(base, {env_name(flag): BAD.get(flag, "bogus")}, capsys)
    assert f"argument {env_name(flag)} (--{flag}): expected " in line


# Each variable read by telemetry, not by a flag: a bad value, what its line names, a good one.
ENV_CASES = {
    "SIDESTREAM_TELEMETRY_SINKS": (
        "span,bogus",
        ("span", "metrics", "access", "none"),
        "span, access",
    ),
    "SIDESTREAM_TELEMETRY_ACCESS_ALL": ("maybe", ("on", "off"), "on"),
}


def test_every_variable_without_a_flag_has_a_case() -> None:
    """Rule: a variable added to ENV_ONLY is tested below (else this fails)."""
    assert set(ENV_CASES) == set(ENV_ONLY)


@pytest.mark.parametrize("name", sorted(ENV_CASES))
def test_a_bad_variable_without_a_flag_is_one_line_too(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: `SIDESTREAM_TELEMETRY_SINKS=bogus` or `SIDESTREAM_TELEMETRY_ACCESS_ALL=maybe`
    (read by telemetry, not by a flag) is refused at the same point, the same way, naming the
    values it takes (it was a traceback, exit 1)."""
    bad, named, good = ENV_CASES[name]
    line = refusal(UPSTREAM, {name: bad}, capsys)
    assert f"{name}: expected " in line
    assert all(value in line for value in named)
    assert load(UPSTREAM, environ={name: good}).listen  # good values still load


def test_switches_take_on_and_off_as_the_docs_write_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rule: `--probe` (and every switch's variable) takes on/off; `maybe` is refused with a
    line that says on or off."""
    assert load([*UPSTREAM, "--probe", "off"], environ={}).probe is False
    assert load(UPSTREAM, environ={"SIDESTREAM_HTTP2": "on"}).http2 is True
    line = refusal([*UPSTREAM, "--probe", "maybe"], {}, capsys)
    assert "expected on or off" in line


def test_certfile_without_keyfile_names_both(capsys: pytest.CaptureFixture[str]) -> None:
    """Rule: one of `--certfile`/`--keyfile` alone is refused naming both and what they take
    (a pair that does not load is a start-up error, exit 1: tests/system/test_startup.py)."""
    line = refusal([*UPSTREAM, "--certfile", "c.pem"], {}, capsys)
    assert "argument --certfile/--keyfile: expected both" in line


def readme_exceptions() -> set[str]:
    """The timeout flags the README says do not take `0`/`off`."""
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"Timeouts take `0` or `off` to disable them, except (.*?), which", text)
    assert found is not None, "the README no longer says which timeouts take 0 or off"
    return set(re.findall(r"`--([a-z-]+)`", found.group(1)))


@pytest.mark.parametrize("flag", TIMEOUTS)
def test_every_timeout_takes_0_and_off_or_the_readme_says_why_not(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: a timeout flag takes `0` and `off` (the timeout off), unless the README names it
    as one that must end; then both are refused with a line saying it cannot be turned off."""
    key = flag.replace("-", "_")
    if flag not in readme_exceptions():
        for value in ("0", "off"):
            assert getattr(load([*UPSTREAM, f"--{flag}", value], environ={}), key) is None
        return
    for value in ("0", "off"):
        line = refusal([*UPSTREAM, f"--{flag}", value], {}, capsys)
        assert f"--{flag}: expected seconds > 0 (this one cannot be turned off)" in line
