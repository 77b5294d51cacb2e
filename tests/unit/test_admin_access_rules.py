"""Who may use the admin control endpoints (`sidecar.admin_access`): the peer address decides
what loopback is, the bearer token is checked exactly, and `--admin-token-file` is read at
start with one clear line for a bad file, never showing the token. Over real sockets:
tests/sockets/test_admin_access.py (loopback) and tests/system/test_admin_other_pod.py (from
another network namespace)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sidecar.admin_access import TOKEN_MAX, AdminAccess, AdminToken, is_loopback
from sidecar.config import load

TOKEN = "s3cr3t-admin-token-0123456789abcdef"
UPSTREAM = ["--upstream", "http://127.0.0.1:8000"]


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.255.3.4", "::1", "::ffff:127.0.0.1", "::ffff:127.9.9.9", "0:0:0:0:0:0:0:1"],
)
def test_loopback_peers(host: str) -> None:
    """127.0.0.0/8, ::1 and IPv4-mapped ::ffff:127.x (a dual-stack listener) are loopback."""
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    [
        "10.200.0.1", "192.0.2.2", "128.0.0.1", "0.0.0.0", "::", "::ffff:10.0.0.1", "fd00::2",
        "fe80::1%eth0", "localhost", "", "127.0.0.1.evil", None,
    ],
)  # fmt: skip
def test_other_peers(host: Any) -> None:
    """Any other address, a name, an empty or missing one is not loopback."""
    assert not is_loopback(host)


def scope(host: str | None, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    client = None if host is None else (host, 40000)
    return {"type": "http", "client": client, "headers": list(headers)}


def test_no_token_means_loopback_only_whatever_the_headers_say() -> None:
    """Without a token, only a loopback peer is allowed: forwarding headers naming
    127.0.0.1 and a bearer header change nothing for another peer or a missing one."""
    access = AdminAccess()
    forged = [
        (b"x-forwarded-for", b"127.0.0.1"),
        (b"forwarded", b"for=127.0.0.1"),
        (b"x-real-ip", b"127.0.0.1"),
        (b"host", b"localhost"),
        (b"authorization", f"Bearer {TOKEN}".encode()),
    ]
    assert access.allows(scope("127.0.0.1")) and access.allows(scope("::1"))
    assert not access.allows(scope("10.200.0.2", *forged))
    assert not access.allows(scope(None, *forged))


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (f"Bearer {TOKEN}".encode(), True),
        (f"bearer {TOKEN}".encode(), True),  # the scheme is case-insensitive (RFC 9110)
        (f"Bearer  {TOKEN} ".encode(), True),
        (f"Bearer {TOKEN[:-1]}".encode(), False),
        (f"Bearer {TOKEN}x".encode(), False),
        (f"Bearer {TOKEN.upper()}".encode(), False),
        (f"Basic {TOKEN}".encode(), False),
        (TOKEN.encode(), False),
        (b"Bearer", False),
        (b"Bearer ", False),
        (b"", False),
        (f"Bearer {TOKEN}".encode() + b"\xff", False),
    ],
)
def test_bearer_token_from_another_peer(header: bytes, allowed: bool) -> None:
    """With a token, another peer is allowed with `Authorization: Bearer <token>`, exactly."""
    access = AdminAccess(AdminToken(TOKEN.encode()))
    assert access.allows(scope("10.200.0.2", (b"authorization", header))) is allowed


def test_the_first_authorization_header_decides() -> None:
    """Two Authorization headers: the first decides (as Starlette reads headers), so a
    wrong first one is not rescued by a right second one."""
    access = AdminAccess(AdminToken(TOKEN.encode()))
    good, bad = (b"authorization", f"Bearer {TOKEN}".encode()), (b"authorization", b"Bearer no")
    assert access.allows(scope("10.200.0.2", good, bad))
    assert not access.allows(scope("10.200.0.2", bad, good))


def write(tmp_path: Path, data: bytes, name: str = "token") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_token_file_is_read_at_start_from_the_flag_or_the_variable(tmp_path: Path) -> None:
    """The token comes from the file (its trailing newline dropped), by flag or by
    SIDESTREAM_ADMIN_TOKEN_FILE; the settings' repr shows the file's path, never the token."""
    path = write(tmp_path, f"{TOKEN}\n".encode())
    by_flag = load([*UPSTREAM, "--admin-token-file", path], environ={})
    by_env = load(UPSTREAM, environ={"SIDESTREAM_ADMIN_TOKEN_FILE": path})
    for settings in (by_flag, by_env):
        token = settings.admin_token_file
        assert token is not None and token.matches(TOKEN.encode())
        assert not token.matches(f"{TOKEN}\n".encode())
        assert TOKEN not in repr(settings) and path in repr(settings)
    assert load(UPSTREAM, environ={}).admin_token_file is None


def bad_files(tmp_path: Path) -> dict[str, str]:
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)  # reading it would block the start for good
    return {
        "missing": str(tmp_path / "absent"),
        "empty": write(tmp_path, b"", "empty"),
        "blank": write(tmp_path, b"  \n\n", "blank"),
        "short": write(tmp_path, b"sh0rt-SECRET\n", "short"),
        "space": write(tmp_path, b"two words-SECRET-0123456789", "space"),
        "control": write(tmp_path, b"tab\there-SECRET-0123456789", "control"),
        "utf8": write(tmp_path, "ünicode-SECRET-0123456789".encode(), "utf8"),
        "huge": write(tmp_path, b"SECRET" * (TOKEN_MAX // 6 + 1), "huge"),
        "directory": str(tmp_path),
        "fifo": fifo,
    }


@pytest.mark.parametrize(
    "case",
    ["missing", "empty", "blank", "short", "space", "control", "utf8", "huge", "directory", "fifo"],
)
def test_bad_token_file_is_one_line_naming_the_flag(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable, empty, short, oversized or unsendable token file (or a FIFO, which
    would hang) exits 2 at start with one line naming the flag, never the file's content."""
    path = bad_files(tmp_path)[case]
    with pytest.raises(SystemExit) as exited:
        load([*UPSTREAM, "--admin-token-file", path], environ={})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--admin-token-file" in err and path in err, err
    assert "SECRET" not in err.replace(path, "")
