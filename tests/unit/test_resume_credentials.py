"""Resume credentials and the resume store's secrets: the credential hash keyed by the
deployment secret (`middleware.resume.ids`, the `Resume` hub), the flags that read the secret
and the Redis password from files (`sidecar.resume_config`), and the store URL as log lines
show it (`middleware.resume.redis_connect.shown`)."""

from __future__ import annotations

import os
from pathlib import Path

import certifi
import pytest

from middleware.resume import Resume
from middleware.resume.ids import credential_hash
from middleware.resume.redis_connect import shown
from sidecar.config import load

SECRET = b"0123456789abcdef-the-deployment-secret"
STREAM = "AAAAAAAAAAAAAAAAAAAAAA"
BEARER = [(b"authorization", b"Bearer tenant-a")]


def settings_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `load` exits with (status 2)."""
    with pytest.raises(SystemExit) as exited:
        load(["--upstream", "http://127.0.0.1:1", *argv], environ={})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# --- the hash -------------------------------------------------------------------------------


def test_the_hash_is_keyed_by_the_secret_and_bound_to_the_stream() -> None:
    """Rule: the same credentials hash alike under one secret and one stream only: another
    secret (another deployment) or another stream id gives another hash, so whoever reads the
    store can neither test guesses without the secret nor link two streams of one client."""
    one = credential_hash(SECRET, STREAM, BEARER)
    assert one == credential_hash(SECRET, STREAM, BEARER)
    assert one != credential_hash(SECRET + b"x", STREAM, BEARER)
    assert one != credential_hash(SECRET, "B" * 22, BEARER)
    assert one != credential_hash(SECRET, STREAM, [(b"authorization", b"Bearer tenant-b")])


def test_a_stream_without_credentials_is_still_bound_to_the_secret() -> None:
    """Rule: a request without credentials gets a hash too, keyed by the secret: a replica
    with another secret cannot resume or stop even such a stream."""
    mine, theirs = credential_hash(SECRET, STREAM, []), credential_hash(b"x" * 32, STREAM, [])
    assert mine and theirs and mine != theirs


def test_cookie_is_a_credential_compared_cookie_by_cookie() -> None:
    """Rule: `Cookie` is a credential by default; its cookies count whatever their order or
    however HTTP/2 split them into fields, and another session cookie is another credential."""
    one = credential_hash(SECRET, STREAM, [(b"cookie", b"session=abc; theme=dark")])
    split = [(b"Cookie", b"theme=dark"), (b"cookie", b"session=abc")]
    assert credential_hash(SECRET, STREAM, split) == one
    assert credential_hash(SECRET, STREAM, [(b"cookie", b"session=xyz; theme=dark")]) != one
    assert credential_hash(SECRET, STREAM, []) != one


def test_named_headers_replace_the_default_credentials() -> None:
    """Rule: a list of credential headers replaces the default one: a header named counts
    (in any case), one left out does not."""
    names = (b"x-session-token",)
    plain = credential_hash(SECRET, STREAM, [], names)
    assert credential_hash(SECRET, STREAM, BEARER, names) == plain
    token = credential_hash(SECRET, STREAM, [(b"X-Session-Token", b"t1")], names)
    assert token != plain
    assert credential_hash(SECRET, STREAM, [(b"x-session-token", b"t2")], names) != token


# --- the hub's key --------------------------------------------------------------------------


def test_a_memory_store_without_a_secret_draws_one_per_process() -> None:
    """Rule: with the memory store and no secret, the key is random per hub (per process): two
    hubs hash the same request differently; a given secret gives the documented hash."""
    assert Resume().credentials(STREAM, BEARER) != Resume().credentials(STREAM, BEARER)
    given = Resume(secret=SECRET, credential_headers=["Authorization"])
    assert given.credentials(STREAM, BEARER) == credential_hash(SECRET, STREAM, BEARER)


def test_a_redis_store_needs_a_secret_of_16_bytes() -> None:
    """Rule: a store replicas may share (Redis) refuses to start without the shared secret,
    and any secret shorter than 16 bytes is refused."""
    with pytest.raises(ValueError, match="secret"):
        Resume("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="16 bytes"):
        Resume(secret=b"short")
    assert Resume("redis://127.0.0.1:1/0", secret=SECRET).credentials(STREAM, [])


# --- the sidecar's flags --------------------------------------------------------------------


def test_redis_without_a_secret_file_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rule: `--resume` with a Redis store and no `--resume-secret-file` exits 2 with one line
    that names the flag and its variable; without `--resume` nothing is asked."""
    err = settings_error(capsys, "--resume", "--resume-store", "redis://127.0.0.1:6379/0")
    assert "--resume-secret-file" in err and "SIDESTREAM_RESUME_SECRET_FILE" in err
    assert load(["--upstream", "http://h:1", "--resume-store", "redis://h:1/0"], environ={})


def test_the_secret_file_is_read_stripped_and_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: the secret file's bytes, without the trailing newline, key the hash (from the flag
    or `SIDESTREAM_RESUME_SECRET_FILE`); the settings' repr names the file, never the secret."""
    path = write(tmp_path, "secret", SECRET + b"\n")
    env = {"SIDESTREAM_RESUME_SECRET_FILE": path}
    settings = load(["--upstream", "http://h:1", "--resume"], environ=env)
    assert settings.resume_secret_file is not None
    assert settings.resume_secret_file.value == SECRET
    assert path in repr(settings) and SECRET.decode() not in repr(settings)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"short-secret\n", "shorter than 16 bytes"),
        (b"x" * 5000, "more than 4096 bytes"),
        (None, "cannot read"),
        ("fifo", "not a regular file"),
    ],
)
def test_a_bad_secret_file_is_one_line_without_its_contents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None, problem: str
) -> None:
    """Rule: a secret file too short, too large, missing or not a regular file (a FIFO would
    block the start) is a one-line flag error that names the file, never what it holds."""
    path = str(tmp_path / "secret")
    if isinstance(content, bytes):
        write(tmp_path, "secret", content)
    elif content == "fifo":
        os.mkfifo(path)
    err = settings_error(capsys, "--resume", "--resume-secret-file", path)
    assert problem in err and "--resume-secret-file" in err and path in err
    assert "short-secret" not in err and "xxxx" not in err


def test_credential_headers_are_a_replacing_list_of_header_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rule: `--resume-credential-headers` takes comma-separated header names, lower-cased,
    in place of the default `authorization,x-api-key,cookie`; a name that is not a token, an
    empty one, or `Last-Event-ID` (every resume changes it) is a flag error."""
    base = ["--upstream", "http://h:1"]
    assert load(base, environ={}).resume_credential_headers == (
        "authorization",
        "x-api-key",
        "cookie",
    )
    flag = ["--resume-credential-headers", "X-Session-Token, Authorization"]
    assert load([*base, *flag], environ={}).resume_credential_headers == (
        "x-session-token",
        "authorization",
    )
    for bad in ("x-a,,x-b", "bad header", "x-a,Last-Event-ID"):
        err = settings_error(capsys, "--resume-credential-headers", bad)
        assert "--resume-credential-headers" in err


def test_the_password_file_and_the_ca_fit_only_their_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule: the password file gives the password apart from the URL (its line end dropped);
    a password in both, a password file for the memory store, or a CA for a store without TLS
    is a one-line flag error that never shows the password."""
    secret = write(tmp_path, "secret", SECRET)
    password = write(tmp_path, "password", b"hunter2-from-file\r\n")
    base = ["--upstream", "http://h:1", "--resume", "--resume-secret-file", secret]
    flags = [*base, "--resume-store", "redis://h:1/0", "--resume-store-password-file", password]
    settings = load(flags, environ={})
    assert settings.resume_store_password_file is not None
    assert settings.resume_store_password_file.value == b"hunter2-from-file"
    twice = ["--resume-store", "redis://:hunter2@h:1/0", "--resume-store-password-file", password]
    err = settings_error(capsys, *base, *twice)
    assert "twice" in err and "hunter2" not in err
    err = settings_error(capsys, *base, "--resume-store-password-file", password)
    assert "--resume-store-password-file" in err and "Redis" in err
    no_tls = ["--resume-store", "redis://h:1/0", "--resume-store-ca", certifi.where()]
    assert "--resume-store-ca" in settings_error(capsys, *base, *no_tls)


def test_a_bad_store_url_is_named_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    """Rule: a store URL redis-py refuses (a bad port, an unknown option) or that is not a
    Redis URL at all is a flag error showing the URL with `***` for its password."""
    for url in (
        "redis://u:hunter2@h:port/0",
        "redis://:hunter2@h:1/0?nonsense=1",
        "mysql://:hunter2@h",
    ):
        err = settings_error(capsys, "--resume-store", url)
        assert "--resume-store" in err and "hunter2" not in err and "***" in err


def test_the_shown_url_hides_the_password_wherever_it_is() -> None:
    """Rule: a store URL in a log line has its password, in the user part or the query, as
    `***`; user, host, port, database and other options stay readable."""
    assert shown("redis://app:p@ss:w0rd@redis:6379/2") == "redis://app:***@redis:6379/2"
    assert shown("rediss://:s3cret@[::1]:6380/0") == "rediss://:***@[::1]:6380/0"
    assert shown("redis://redis:6379/0?password=s3cret&db=1") == (
        "redis://redis:6379/0?password=***&db=1"
    )
    assert shown("redis://redis:6379/0") == "redis://redis:6379/0"
    assert "s3cret" not in shown("redis://:s3cret@[::1")
