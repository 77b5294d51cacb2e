"""A scripted OpenAI-style server for forced usage's tests (issue 47): the stream it writes
depends on what the request asked for, as vLLM's and OpenAI's do.

A `Script` is one stream's framing and content. Asked for `include_usage`, the server adds a
`"usage":null` member to every chunk (where the script says: last as vLLM, before an
`obfuscation` pad as OpenAI, or first; or not at all) and a usage chunk before `[DONE]` (with
`"choices":[]` or without the key); asked for `continuous_usage_stats` too, usage so far in
place of the null. Everything else — line ends, `data:` with or without its space, `id:`,
`event:`, `retry:` and comment lines in an event, a BOM, comment blocks between events, a
`"usage":null` nested in a choice that the server always writes — is the same whatever was
asked. So a client that did not ask must read `stream(False, False)` in every usage mode.

`ScriptedServer` is that server as an ASGI app (relaying with `SEND_NOWAIT` where offered,
as the proxy does); `raw_handler` as a raw HTTP/1.1 upstream (tests/support/upstreams.py's
`RawUpstream`). `scripts()` draws scripts for hypothesis; `QUIRKS` are named ones.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from middleware.types import SEND_NOWAIT, Receive, Scope, Send
from tests.support.upstreams import RawConnection

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


@dataclass(frozen=True)
class Framing:
    """How one kind of event is written: its line end, `data:`'s space, the lines around
    its data line (fields and comments)."""

    end: bytes = b"\n"
    space: bool = True
    before: tuple[bytes, ...] = ()
    after: tuple[bytes, ...] = ()

    def event(self, data: bytes) -> bytes:
        lines = [*self.before, (b"data: " if self.space else b"data:") + data, *self.after]
        return b"".join(line + self.end for line in lines) + self.end


@dataclass(frozen=True)
class Script:
    """One stream (see the module docstring). `cuts`: where it is cut into reads (offsets,
    taken modulo its length); `one_byte`: one byte a read instead."""

    texts: tuple[str, ...] = ("Hel", "lo")
    chunks: Framing = Framing()
    usage_event: Framing = Framing()
    done: Framing | None = Framing()
    null: str = "last"  # "last", "middle", "first", "none"
    spaced: bool = False  # JSON written with ", " and ": "
    with_choices: bool = True  # the usage chunk has "choices": []
    nested: bool = False  # every choice holds "usage": null, asked or not
    bom: bool = False
    pings: bool = False  # a `: ping` comment block after each content event
    cuts: tuple[int, ...] = ()
    one_byte: bool = False
    # Asked, usage goes on the finish chunk beside its choice (no usage chunk of its own):
    # the shape whose forced usage cannot be taken out exactly.
    usage_on_finish: bool = False

    def _json(self, members: list[tuple[str, Any]]) -> bytes:
        sep, colon = (", ", ": ") if self.spaced else (",", ":")
        text = sep.join(
            json.dumps(k) + colon + json.dumps(v, separators=(sep, colon), ensure_ascii=False)
            for k, v in members
        )
        return ("{" + text + "}").encode()

    def _usage(self, members: list[tuple[str, Any]], value: Any) -> list[tuple[str, Any]]:
        if self.null == "middle":
            return [*members[:-1], ("usage", value), members[-1]]
        if self.null == "first":
            return [("usage", value), *members]
        return [*members, ("usage", value)]

    def _chunk(self, n: int, choice: dict[str, Any], asked: bool, continuous: bool) -> bytes:
        if self.nested:
            choice = {**choice, "usage": None}
        members: list[tuple[str, Any]] = [
            ("id", "chatcmpl-7"),
            ("object", "chat.completion.chunk"),
            ("created", 1),
            ("model", "m"),
            ("choices", [choice]),
        ]
        if self.null == "middle":
            members.append(("obfuscation", "pQ3"))
        if continuous:
            used = {"prompt_tokens": 3, "total_tokens": 3 + n, "completion_tokens": n}
            members = self._usage(members, used)
        elif asked and self.null != "none":
            members = self._usage(members, None)
        return self.chunks.event(self._json(members))

    def stream(self, asked: bool, continuous: bool) -> bytes:
        """The bytes the server writes for a request that asked (`include_usage`) or not,
        and for `continuous_usage_stats`."""
        out = [b"\xef\xbb\xbf"] if self.bom else []
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        out.append(self._chunk(0, role, asked, continuous))
        for n, text in enumerate(self.texts, 1):
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            out.append(self._chunk(n, choice, asked, continuous))
            if self.pings:
                out.append(b": ping" + self.chunks.end + self.chunks.end)
        finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
        count = len(self.texts)
        used = {"prompt_tokens": 3, "total_tokens": 3 + count, "completion_tokens": count}
        members: list[tuple[str, Any]]
        if asked and self.usage_on_finish:
            members = [("id", "chatcmpl-7"), ("choices", [finish]), ("usage", used)]
            out.append(self.chunks.event(self._json(members)))
        else:
            out.append(self._chunk(count, finish, asked, continuous))
        if asked and not self.usage_on_finish:
            members = [("id", "chatcmpl-7"), ("model", "m")]
            if self.with_choices:
                members.append(("choices", []))
            members.append(("usage", used))
            if self.null == "middle":
                members.append(("obfuscation", "x"))
            out.append(self.usage_event.event(self._json(members)))
        if self.done is not None:
            out.append(self.done.event(b"[DONE]"))
        return b"".join(out)

    def reads(self, asked: bool, continuous: bool) -> list[bytes]:
        """`stream(...)` cut into the reads the server writes it in."""
        data = self.stream(asked, continuous)
        if self.one_byte:
            return [data[i : i + 1] for i in range(len(data))]
        at = sorted({cut % len(data) for cut in self.cuts} | {0, len(data)})
        return [data[a:b] for a, b in itertools.pairwise(at)]


def asked_for(body: bytes) -> tuple[bool, bool]:
    """What a request body asked for: include_usage, continuous_usage_stats (as vLLM reads it)."""
    options = json.loads(body).get("stream_options") or {}
    asked = options.get("include_usage") is True
    return asked, asked and options.get("continuous_usage_stats") is True


@dataclass
class ScriptedServer:
    """`script` served as an ASGI app; `asked` records what each request asked for."""

    script: Script = field(default_factory=Script)
    asked: list[tuple[bool, bool]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        asked = asked_for(body)
        self.asked.append(asked)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        offer = (scope.get("extensions") or {}).get(SEND_NOWAIT)
        nowait: Callable[[bytes], bool] | None = offer.get("send") if offer else None
        for piece in self.script.reads(*asked):
            if nowait is None or not nowait(piece):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def raw_handler(server: ScriptedServer) -> Callable[[RawConnection], Any]:
    """`server` as a raw HTTP/1.1 upstream: each read a chunk of its own, drained before the
    next is written (so most reach the sidecar as separate reads)."""

    async def handle(connection: RawConnection) -> None:
        reader = connection.reader
        while head := await connection.read_head():
            fields = dict(
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
            )
            if fields.get(b"transfer-encoding") == b"chunked":  # an HTTP/2 client's body
                body = b""
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    body += (await reader.readexactly(size + 2))[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
            else:
                body = await reader.readexactly(int(fields.get(b"content-length", b"0")))
            asked = asked_for(body)
            server.asked.append(asked)
            writer = connection.writer
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for piece in server.script.reads(*asked):
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return handle


# -- hypothesis ----------------------------------------------------------------------------------

_FIELDS = st.sampled_from(
    [b"id: 5", b"id:chatcmpl-7", b"event: message", b"retry: 3000", b": c", b":"]
)
_framings = st.builds(
    Framing,
    end=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    space=st.booleans(),
    before=st.lists(_FIELDS, max_size=2).map(tuple),
    after=st.lists(_FIELDS, max_size=2).map(tuple),
)
_texts = st.text(st.sampled_from('ab "\\\n\u00e9\U0001f600{}usage:,'), max_size=6)


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    """Any script: each kind of event framed its own way, usage null anywhere or nowhere,
    the usage chunk with or without choices, cut anywhere or a byte a read."""
    chunks = draw(_framings)
    return Script(
        texts=tuple(draw(st.lists(_texts, max_size=3))),
        chunks=chunks,
        usage_event=draw(st.just(chunks) | _framings),
        done=draw(st.just(chunks) | _framings | st.none()),
        null=draw(st.sampled_from(["last", "middle", "first", "none"])),
        spaced=draw(st.booleans()),
        with_choices=draw(st.booleans()),
        nested=draw(st.booleans()),
        bom=draw(st.booleans()),
        pings=draw(st.booleans()),
        cuts=tuple(draw(st.lists(st.integers(0, 4000), max_size=12))),
        one_byte=draw(st.integers(0, 9)) == 0,
    )


CRLF, CR = Framing(end=b"\r\n"), Framing(end=b"\r")
# The quirks of issue 47, each a stream that got through forced usage changed before.
QUIRKS: dict[str, Script] = {
    "vllm": Script(),
    "openai-null-mid": Script(null="middle"),
    "null-first": Script(null="first"),
    "spaced-json": Script(spaced=True),
    "no-null": Script(null="none"),
    "no-space": Script(chunks=Framing(space=False), usage_event=Framing(space=False)),
    "crlf": Script(chunks=CRLF, usage_event=CRLF, done=CRLF),
    "lone-cr": Script(chunks=CR, usage_event=CR, done=CR),
    "ids": Script(chunks=Framing(before=(b"id: 1",)), usage_event=Framing(before=(b"id: 2",))),
    "event-and-retry": Script(usage_event=Framing(before=(b"event: usage", b"retry: 10"))),
    "comment-inside": Script(usage_event=Framing(before=(b": c",), after=(b": d",))),
    "done-framed-apart": Script(done=Framing(end=b"\r\n", space=False)),
    "usage-without-choices": Script(with_choices=False),
    "nested-null-kept": Script(nested=True),
    "bom-and-pings": Script(bom=True, pings=True),
    "one-byte-reads": Script(chunks=CRLF, usage_event=CR, one_byte=True),
    "crlf-split-between-cr-and-lf": Script(
        chunks=CRLF, usage_event=CRLF, cuts=tuple(range(1, 4000, 7))
    ),
}
