"""The resume flags that read a file or only make sense together (`sidecar.config` lists them).

- `--resume-secret-file`: the secret that keys the credential hash stored with each stream
  (`middleware.resume.ids`). Replicas sharing a store share it; a Redis store needs it;
- `--resume-store-password-file`: the Redis password apart from the store's URL, so that it
  stays out of a pod spec (a Kubernetes Secret mounted as a file);
- `--resume-credential-headers`: the request headers a resume or stop must repeat;
- `--resume-store`: `memory` or a Redis URL, read by redis-py's own URL handling (a Sentinel
  one, `redis+sentinel://`, and a Cluster one, `redis+cluster://`, by
  `middleware.resume.redis_connect`).

A file's contents never appear in an error message, a `repr` or a log line: errors name the
file, and `FileSecret` shows its path only.
"""

from __future__ import annotations

import re
from typing import Any

from sidecar.settings_values import small_file

FILE_MAX = 4096  # bytes read from a secret or password file: a value, not a document
# A header name is an RFC 9110 token; lower-case, as ASGI servers hand headers on.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


class FileSecret:
    """A secret read from a file at start; its repr names the file only."""

    __slots__ = ("source", "value")

    def __init__(self, value: bytes, source: str) -> None:
        self.value = value
        self.source = source

    def __repr__(self) -> str:
        return f"FileSecret(from {self.source!r})"


def resume_store(value: str) -> str:
    """`memory`, or a Redis URL: redis://[USER:PASSWORD@]HOST:PORT[/DB] (rediss:// with TLS),
    read by redis-py, redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/SERVICE[/DB], or
    redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]. An error shows the URL without its
    password."""
    from middleware.resume.redis_connect import connect, shown

    if value == "memory":
        return value
    if value.startswith(("redis://", "rediss://", "redis+sentinel://", "redis+cluster://")):
        connect(value)
        return value
    raise ValueError(
        "expected 'memory' or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL, "
        f"got {shown(value)!r}"
    )


def secret_file(path: str) -> FileSecret:
    """The file's bytes, surrounding whitespace (a trailing newline) removed: 16 at least."""
    from middleware.resume.ids import MIN_SECRET_BYTES

    secret = small_file(path, FILE_MAX).strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the secret in {path!r} is shorter than {MIN_SECRET_BYTES} bytes "
            "(make one with `openssl rand -base64 32`)"
        )
    return FileSecret(secret, path)


def password_file(path: str) -> FileSecret:
    """The file's one line, UTF-8, without its line end (spaces are the password's own)."""
    password = small_file(path, FILE_MAX).rstrip(b"\r\n")
    if not password or b"\n" in password or b"\r" in password:
        raise ValueError(f"{path!r}: expected the password alone on one line")
    try:
        password.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the password in {path!r} is not UTF-8") from None
    return FileSecret(password, path)


def header_names(value: str) -> tuple[str, ...]:
    """NAME[,NAME…]: header names, case-insensitive, at least one."""
    names = tuple(dict.fromkeys(name.strip().lower() for name in value.split(",")))
    bad = next((name for name in names if _TOKEN.fullmatch(name) is None), None)
    if bad is not None:
        raise ValueError(f"expected header names separated by commas, got {value!r}")
    if "last-event-id" in names:  # it differs between the first request and its resume
        raise ValueError("Last-Event-ID cannot be a credential: a resume always changes it")
    return names


def resume_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with the resume flags together (a line for `load`), or None."""
    store = values["resume_store"]
    password, ca = values["resume_store_password_file"], values["resume_store_ca"]
    if store == "memory":
        if password is not None:
            return "argument --resume-store-password-file: needs a Redis --resume-store"
        if ca is not None:
            return "argument --resume-store-ca: needs a rediss:// --resume-store"
        return None
    if values["resume_secret_file"] is None:
        return (
            "argument --resume-secret-file (SIDESTREAM_RESUME_SECRET_FILE) is required with a "
            "Redis --resume-store: the secret every replica sharing the store is given"
        )
    if ca is not None and not store.startswith("rediss://"):
        return "argument --resume-store-ca: needs a rediss:// --resume-store"
    from middleware.resume.redis_connect import connect

    try:
        connect(store, password=None if password is None else password.value.decode())
    except ValueError as exc:
        return f"argument --resume-store-password-file: {exc}"
    return None
