"""Every Python snippet of the docs runs as written: README.md and every markdown file under
docs/, through Sybil.

Why Sybil: it is maintained (10.x, released 2026), reads markdown's fenced ```python blocks
as written, runs a document's blocks in order in one namespace, and takes checks that the
reader does not see as HTML comments (`<!-- invisible-code-block: python`), so a snippet
stays what a user would type while the test still looks at what it did. pytest-markdown-docs
shares names between blocks only by a `continuation` mark in the fence and has no hidden
blocks (a check would have to sit in the snippet); pytest-examples is built to lint and
format examples more than to run a document's blocks together.

Sybil's pytest plugin (`pytest_collect_file`) collects only files that pytest walks, and
this suite walks `tests/` alone, each test in a tier's directory (tests/conftest.py): the
documents are parsed with Sybil here instead, one test per document, its examples evaluated
in order in one namespace, as a reader runs them. The namespace also holds the checks the
invisible blocks call (`check_*`, below).

A snippet that talks to a server reads the server's address from a named variable with the
docs' address as its default (`SIDECAR_URL`, default `http://localhost:8080`); the test starts
the emulator and the sidecar (`--resume`) on free ports and sets that variable, through a
relay that cuts the first connection mid-stream, so the snippet's resume path runs too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from middleware.registry import StreamRegistry
from middleware.telemetry import Telemetry
from sidecar.app import build_guard
from sidecar.config import load
from sidecar.emulator import Stats, make_app
from tests.support.clients import request
from tests.support.servers import serve
from tests.support.sseparse import parse

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
FENCE = re.compile(r"^\s*(?:```|~~~)\s*([\w+-]*)", re.M)
CUT_AFTER = 1500  # response bytes through the relay before it drops the first connection


def python_docs() -> list[Path]:
    return [doc for doc in DOCS if "python" in FENCE.findall(doc.read_text())]


# -- the servers a snippet talks to ----------------------------------------------------------


@contextlib.asynccontextmanager
async def cutting_relay(target: int) -> AsyncIterator[tuple[int, list[int], list[bytearray]]]:
    """A TCP relay to `target`; its first connection is dropped (both ways) after `CUT_AFTER`
    response bytes, "the connection dropped"; the others are relayed whole. Yields (port,
    the connections cut, each connection's response bytes)."""
    cut: list[int] = []
    responses: list[bytearray] = []
    accepted = 0
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int, seen: bytearray
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while len(seen) < limit and (data := await reader.read(65536)):
                data = data[: limit - len(seen)]
                seen += data
                writer.write(data)
                await writer.drain()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        nonlocal accepted
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        number, accepted = accepted, accepted + 1
        responses.append(bytearray())
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        limit = CUT_AFTER if number == 0 else 1 << 62
        up = asyncio.create_task(pipe(client_r, server_w, 1 << 62, bytearray()))
        try:
            await pipe(server_r, client_w, limit, responses[number])
            if number == 0:
                cut.append(number)
        finally:
            up.cancel()
            client_w.close()
            server_w.close()
            tasks.discard(task)

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], cut, responses
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


class Servers:
    """The emulator and the sidecar (`--resume`, memory store) behind `cutting_relay`, on a
    loop of their own in a thread: the snippet's openai client blocks the test's thread."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.cut: list[int] = []
        self.responses: list[bytearray] = []
        self.url = ""
        self.started = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="doc-servers")

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # handed to the test's thread
            self.failure = exc
            self.started.set()

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(make_app(stats=self.stats)) as upstream:
            settings = load(["--upstream", f"http://127.0.0.1:{upstream}", "--resume"], environ={})
            guard = build_guard(settings, StreamRegistry(), None)
            async with serve(guard, "sidecar") as port, cutting_relay(port) as relayed:
                relay, self.cut, self.responses = relayed
                self.url = f"http://127.0.0.1:{relay}"
                self.started.set()
                await self.stop.wait()

    def __enter__(self) -> Servers:
        self.thread.start()
        assert self.started.wait(30), "the doc servers did not start"
        if self.failure is not None:
            raise self.failure
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


# -- the checks invisible blocks call --------------------------------------------------------


async def _get(app: Any, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    async with serve(app) as port:
        response = await request(port, method, path)
        try:
            body = await asyncio.wait_for(response.body(), 30)
        finally:
            response.close()
    return response.status, {k.lower(): v for k, v in response.headers}, body


def check_guarded_stream(app: Any, path: str, tokens: list[str]) -> None:
    """`app`, served by uvicorn, streams `tokens` as SSE with the guard's headers."""
    status, headers, body = asyncio.run(_get(app, "POST", path))
    assert status == 200, body
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache, no-transform"
    assert headers["x-accel-buffering"] == "no"
    events = [data for _, data, _ in parse(body)]
    assert events[-1] == "[DONE]"
    got = [json.loads(data)["choices"][0]["delta"]["content"] for data in events[:-1]]
    assert got == tokens


def check_passes_through(app: Any, path: str, status: int) -> None:
    """`app`, served by uvicorn, answers `path` with its inner app's `status`."""
    assert asyncio.run(_get(app, "GET", path))[0] == status


def dechunked(response: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response, as far as it came."""
    body, rest = b"", response.partition(b"\r\n\r\n")[2]
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2 :]
    return body


def doc_namespace(servers: Servers | None) -> dict[str, Any]:
    namespace: dict[str, Any] = {
        "check_guarded_stream": check_guarded_stream,
        "check_passes_through": check_passes_through,
    }
    if servers is not None:

        def check_resumed_once(sid: str, seen: int) -> None:
            """The first connection was cut after `seen` events, the snippet's resume read
            the events after them, to the end, and the upstream generated the stream once."""
            assert servers.cut == [0], "the relay did not cut the first connection"
            first, resumed = (parse(dechunked(bytes(r))) for r in servers.responses[:2])
            assert seen == len(first) >= 1
            assert [e[2] for e in first + resumed] == [
                f"{sid}:{n}" for n in range(1, seen + 1 + len(resumed))
            ]
            assert resumed[-1][1] == "[DONE]"
            assert servers.stats.streams_started == 1

        namespace["check_resumed_once"] = check_resumed_once
    return namespace


@contextlib.contextmanager
def access_log_kept() -> Iterator[None]:
    """The access logger as it was (a snippet may call `configure_access_log()`)."""
    log = logging.getLogger("sidestream.access")
    handlers, level, propagate = log.handlers[:], log.level, log.propagate
    try:
        yield
    finally:
        for handler in log.handlers:
            if handler not in handlers:
                handler.close()
        log.handlers[:], log.level, log.propagate = handlers, level, propagate


@pytest.mark.parametrize("doc", python_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_snippet_runs_as_written(doc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: each ```python block of a document runs, in order, as a reader pastes them into
    one interpreter; the invisible checks after them hold (what a snippet's app serves, a
    resume after a dropped connection)."""
    document = SYBIL.parse(doc)
    examples = list(document)
    assert examples, f"{doc.name}: Sybil found no example"
    talks = "SIDECAR_URL" in doc.read_text()
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(Servers()) if talks else None
        if servers is not None:
            monkeypatch.setenv("SIDECAR_URL", servers.url)
        stack.enter_context(access_log_kept())
        document.namespace.update(doc_namespace(servers))
        try:
            for example in examples:
                example.evaluate()
        finally:
            for name, value in document.namespace.items():
                if isinstance(value, Telemetry):
                    value.shutdown()
                elif name == "client" and hasattr(value, "close"):
                    value.close()


def test_every_python_block_is_one_sybil_reads() -> None:
    """Rule: a Python snippet is fenced ```python, the language Sybil runs: one spelt `py`,
    `python3` or `pycon` would be shown to readers and never run."""
    for doc in DOCS:
        spelt = set(FENCE.findall(doc.read_text()))
        assert not spelt & {"py", "python3", "pycon", "py3", "ipython"}, doc.name
    assert python_docs(), "no document holds a Python snippet: the test above runs nothing"
