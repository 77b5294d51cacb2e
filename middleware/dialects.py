"""Per-format knowledge of LLM event streams: tokens, usage, ids, finish reasons, error events.

A dialect is chosen by request path (`select`), else by the shape of the first event
(`sniff`). Dialects are stateless singletons; all per-stream state is in `StreamStats`.

Hot path: `is_token` and `observe` decide with precompiled regexes and substring checks on
`event.data` and call `json.loads` only for the few events that carry something rare (the
first event, usage, a finish reason, the end-of-stream summary). The regexes look for
`"key": value` with the key's quotes unescaped, which text inside a JSON string can never
produce (its quotes are escaped), so content that merely mentions a key does not fool them.

Deliberate choices (do not "fix" these):

- Generated tokens that are not visible text still count as tokens, because the first-token
  timeout must not fire while a model reasons or writes a tool call: OpenAI
  `reasoning_content` / `reasoning` / `refusal` / tool-call `arguments`, Anthropic
  `thinking_delta` / `input_json_delta`, every Responses `response.*.delta`.
- `tokens` counts events that carry content, not model tokens; exact counts come from usage.
- `done` means the stream ended the way its protocol ends a *successful* stream: an upstream
  error event or a Responses `response.failed` does not set it.
- Malformed JSON never raises: it is counted in `StreamStats.malformed` and skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from middleware.sse import CR, LF, Event

__all__ = ["Dialect", "StreamStats", "json_object", "select", "sniff"]


@dataclass(slots=True)
class StreamStats:
    """What `Dialect.observe` learned about one stream; read by telemetry at its end."""

    events: int = 0  # events observed
    tokens: int = 0  # events that carried content (see Dialect.is_token)
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    input_tokens: int | None = None  # from usage, when the stream reports it
    output_tokens: int | None = None
    done: bool = False  # saw the dialect's end-of-stream marker
    malformed: int = 0  # events whose JSON could not be parsed where it was needed
    frame: Frame | None = None  # learned from a plain token chunk (Dialect.count_chunk)


# What json.loads runs under its Python layers: the C scanner, (value, end) from an index
# (typeshed does not declare the attribute).
_scan: Callable[[str, int], tuple[Any, int]]
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """The JSON object `text` holds, None when it holds anything else or is not JSON.

    Compact UTF-8 JSON, what servers send and clients post, goes to the C scanner directly:
    `json.loads`' Python layers (encoding detection, whitespace skipping, its checks) cost
    more than parsing a chunk. Whatever the scanner does not take whole (whitespace around
    the value, a BOM, UTF-16, not JSON) is left to `json.loads`, so the result is its own.
    """
    try:
        data = text.decode() if isinstance(text, bytes) else text
        obj, end = _scan(data, 0)
        if end == len(data):
            return obj if type(obj) is dict else None
    except (StopIteration, ValueError, RecursionError):
        pass
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _loads(data: str, stats: StreamStats) -> dict[str, Any]:
    """The event's JSON object, or {} (counted as malformed) when it is not one."""
    obj = json_object(data)
    if obj is not None:
        return obj
    stats.malformed += 1
    return {}


def _dict(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Frame:
    """One stream's plain token chunk around its content string (see `count_chunk`):
    `prefix` up to the string's opening quote, `marker` from its closing quote to the end
    of the choices array, `suffix` from that quote to the end of the chunk."""

    __slots__ = ("marker", "prefix", "shortest", "start", "suffix", "tail_len", "varies")

    def __init__(self, prefix: bytes, marker: bytes, suffix: bytes) -> None:
        self.prefix = prefix
        self.start = len(prefix)  # the content string's first byte
        self.marker = marker
        self.suffix = suffix
        self.tail_len = len(suffix) - len(marker)
        # A token chunk holds the prefix, one content byte, the marker and a line end at least.
        self.shortest = self.start + 1 + len(marker) + 2
        self.varies = False  # a token chunk has had a tail other than the learned one

    def matches(self, body: bytes) -> bool:
        """Is `body` one event and one token of this frame: the same prefix, one line (its
        first line end is the event's end: a second event would need another), content not
        empty (so a token, whatever else the delta holds), then the same suffix or the
        marker and a tail of its own (OpenAI's obfuscation pad, the emulator's timestamp)
        with no usage in it. Runs once per relayed token; the caller counts.

        The usual case, the learned suffix, takes the prefix and the suffix off: the content
        is what is left, and it must not start with the closing quote of "" nor hold a line
        end (prefix and suffix hold none but the event's end). `removeprefix` and
        `removesuffix` take one argument where `startswith` and `endswith` parse a tuple of
        them, and their checks add to no more than the rest: ~40% less time per chunk.
        `Cycle._relayed` writes this case out inline before calling here: keep the two the
        same."""
        if not self.varies:
            rest = body.removeprefix(self.prefix)
            content = rest.removesuffix(self.suffix)
            if rest is not body and content is not rest and content and content[0] != 34:
                return LF not in content
        if not (
            len(body) >= self.shortest  # a read may end anywhere, right after the prefix too
            and body.startswith(self.prefix)
            # One line, then line ends (it ends with a blank line: checked below). What
            # rstrip() takes besides is blank lines and lines of spaces, which make no event;
            # it is also cheaper than the slice body[:-2] (no slice object).
            and LF not in body.rstrip()
            and body[self.start] != 34  # not the closing quote of ""
            and body[-2:] == b"\n\n"  # the end of an event
        ):
            return False
        # A tail of its own after the marker.
        marker = self.marker
        close = len(body) - self.tail_len  # a tail as long as the learned one: the usual
        if body[close - len(marker) : close] != marker:
            close = body.rfind(b"}]") + 2
            if close <= self.start or body[close - len(marker) : close] != marker:
                return False
        tail = body[close:]
        usage = tail.count(b'"usage"')
        if usage and usage != tail.count(b'"usage":null'):
            return False
        self.varies = True  # a tail per chunk: check it first from now on
        return True


def _identify(obj: dict[str, Any], stats: StreamStats) -> None:
    """Take the response id and model from `obj` where the stats do not have them yet."""
    if stats.response_id is None:
        stats.response_id = _str(obj, "id")
    if stats.response_model is None:
        stats.response_model = _str(obj, "model")


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One complete SSE event; json.dumps escapes newlines, so `data` is one line."""
    line = "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"
    return (line if event is None else f"event: {event}\n{line}").encode()


_TYPE = re.compile(r'"type"\s*:\s*"([^"\\]*)"')


def _type(event: Event) -> str:
    """The event's type: its `event:` field, else the first "type" key of its data."""
    if event.event != "message":
        return event.event
    match = _TYPE.search(event.data)
    return match.group(1) if match else ""


class Dialect:
    """Generic fallback: every data event except `[DONE]` is a chunk carrying content."""

    name = "generic"
    operation = "chat"

    def is_token(self, event: Event) -> bool:
        return event.data != "[DONE]" and event.data != ""

    def observe(self, event: Event, stats: StreamStats) -> None:
        """Update `stats` from one event. Never raises on malformed data."""
        stats.events += 1
        if self.is_token(event):
            stats.tokens += 1
        self._details(event, stats)

    def count_chunk(self, body: bytes, stats: StreamStats) -> bool:
        """Account for a whole chunk at once, without splitting it into events.

        A fast path for the usual chunk: only called at an event boundary. Returns False,
        changing nothing, when the chunk is not plain enough to decide this way; the caller
        then feeds it event by event.
        """
        return False

    def _details(self, event: Event, stats: StreamStats) -> None:
        if event.data == "[DONE]":
            stats.done = True
        elif stats.events == 1 and event.data.startswith("{"):
            _identify(_loads(event.data, stats), stats)

    def error_event(self, error: dict[str, str]) -> bytes:
        """One complete terminal SSE event carrying `error` (message, type, code)."""
        return _sse({"error": error})


_CHAT_TOKEN = re.compile(
    r'"(?:content|reasoning_content|reasoning|refusal|arguments)"\s*:\s*"(?!")'
)
_COMPLETION_TOKEN = re.compile(r'"text"\s*:\s*"(?!")')
_USAGE = re.compile(r'"usage"\s*:\s*\{')
_FINISH_REASON = re.compile(r'"finish_reason"\s*:\s*"')
DONE_CHUNK = b"data: [DONE]\n\n"
# What makes a read of token chunks more than that (count_chunk): usage, a finish reason that
# is not null, reasoning, a refusal, tool-call arguments. One search: each byte search costs
# ~1,500 instructions in CPython 3.11 whatever its spelling (`find`/`count` parse an argument
# tuple, `in` tries the needle as an int first), about what this regex takes for a chunk.
_NOT_PLAIN = re.compile(rb'"usage"|"finish_reason"(?!:null)|"reasoning|"refusal":"|"arguments":"')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"')  # a JSON string's rest, to its closing quote


def _string_end(body: bytes, start: int) -> int:
    """Where the JSON string whose text starts at `start` closes (its quote), or -1."""
    rest = _STRING_REST.match(body, start)
    return -1 if rest is None else rest.end() - 1


class OpenAIChat(Dialect):
    """OpenAI chat completions chunks, as OpenAI, vLLM, TGI's /v1 and llama.cpp send them."""

    name = "openai.chat"
    operation = "chat"
    _token = _CHAT_TOKEN
    # The regex's keys, the first being `_literal`'s.
    _token_keys: tuple[str, ...] = ('"content"', '"reasoning', '"refusal"', '"arguments"')

    _literal = '"content":"'  # how OpenAI and vLLM write it: decides most chunks without the regex
    _key = b'"content":'
    _key_empty = b'"content":""'
    _key_null = b'"content":null'

    def is_token(self, event: Event) -> bool:
        data = event.data
        keys = self._token_keys  # the regex's keys, by substring: most events hold none
        at = data.find(self._literal)
        if at >= 0:
            if data[at + len(self._literal) : at + len(self._literal) + 1] not in ('"', ""):
                return True
            if data.find(keys[0]) == at and data.find(keys[0], at + 1) < 0:
                keys = keys[1:]  # the one content key holds "" (the role chunk): the others
        for key in keys:
            if key in data:
                return self._token.search(data) is not None
        return False

    def count_chunk(self, body: bytes, stats: StreamStats) -> bool:
        """Whole one-line `data: {...}` events whose only content key is `content` (`text`),
        carrying no usage and no finish reason: each event is one chunk, and those whose
        content string is non-empty are tokens. JSON escapes quotes and newlines inside
        strings, so the byte searches below only see keys and line ends.

        Within one stream such chunks differ only in their content string (id, model and
        created repeat) and perhaps in a tail after the choices (OpenAI's obfuscation pad,
        the emulator's timestamp), so the first one teaches the stream's `Frame`
        (`stats.frame`), and the cycle's token path decides later token chunks with it
        before it calls here: a chunk that reaches this has failed the frame already, so
        it is not checked again. `data: [DONE]` is taken whole too.
        """
        if body == DONE_CHUNK:  # the stream's last chunk, as every server writes it
            stats.events += 1
            stats.done = True
            return True
        if not stats.events or not body.startswith(b"data: ") or CR in body:
            return False  # the first event is parsed whole (id, model)
        last = len(body) - 2
        if body.find(b"\n") == last and body.endswith(b"\n\n"):  # one event: the usual chunk
            events = 1
            if body.count(self._key) != 1:
                return False
        else:
            events = body.count(b"\n\n")
            if (
                not events
                or body.count(self._key) != events  # first: it refuses the finish groups
                or body.count(b"\n") != 2 * events
                or body.count(b"\n\ndata: ") != events - 1
                or not body.endswith(b"\n\n")
            ):
                return False
        if _NOT_PLAIN.search(body) is not None:
            return False
        empty = body.count(self._key_empty) + body.count(self._key_null)
        stats.events += events
        stats.tokens += events - empty
        if stats.frame is None and events == 1 and not empty:
            self._learn_frame(body, stats)
        return True

    def _learn_frame(self, body: bytes, stats: StreamStats) -> None:
        start = body.find(self._key + b'"')
        if start < 0:
            return  # `"content": "..."` with a space: no frame, the checks above go on
        start += len(self._key) + 1
        end = _string_end(body, start)  # the closing quote: the marker starts with it
        close = body.find(b"}]", end)
        if end < 0 or close < 0:
            return
        marker = body[end : close + 2]
        if marker.find(b"[") < 0 and marker.find(b'"usage"') < 0:
            stats.frame = Frame(body[:start], marker, body[end:])

    def _details(self, event: Event, stats: StreamStats) -> None:
        data = event.data
        if data == "[DONE]":
            stats.done = True
            return
        if (
            stats.events != 1
            and ('"usage"' not in data or _USAGE.search(data) is None)
            and (
                data.count('"finish_reason"') == data.count('"finish_reason":null')
                or _FINISH_REASON.search(data) is None
            )
        ):
            return
        obj = _loads(data, stats)
        _identify(obj, stats)
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            reason = _str(choice, "finish_reason") if isinstance(choice, dict) else None
            if reason is not None:
                stats.finish_reasons.append(reason)
        usage = _dict(obj, "usage")
        if usage:
            stats.input_tokens = _int(usage, "prompt_tokens")
            stats.output_tokens = _int(usage, "completion_tokens")


class OpenAICompletions(OpenAIChat):
    """OpenAI legacy completions chunks (`choices[].text`)."""

    name = "openai.completions"
    operation = "text_completion"
    _token = _COMPLETION_TOKEN
    _token_keys = ('"text"',)
    _literal = '"text":"'
    _key = b'"text":'
    _key_empty = b'"text":""'
    _key_null = b'"text":null'


_DELTA = re.compile(r'"delta"\s*:\s*"(?!")')
_RESPONSE_ENDS = {"response.completed": True, "response.incomplete": True, "response.failed": False}


class OpenAIResponses(Dialect):
    """OpenAI Responses API: `event: response.*` with a JSON `type` repeating the event name."""

    name = "openai.responses"
    operation = "chat"

    def is_token(self, event: Event) -> bool:
        kind = _type(event)
        return (
            kind.startswith("response.")
            and kind.endswith(".delta")
            and _DELTA.search(event.data) is not None
        )

    def _details(self, event: Event, stats: StreamStats) -> None:
        kind = _type(event)
        end = _RESPONSE_ENDS.get(kind)
        if end is None and stats.events != 1 and kind != "response.created":
            return
        response = _dict(_loads(event.data, stats), "response")
        _identify(response, stats)
        if end is None:
            return
        stats.done = end
        status = _str(response, "status")
        if status is not None:
            stats.finish_reasons.append(status)
        usage = _dict(response, "usage")
        if usage:
            stats.input_tokens = _int(usage, "input_tokens")
            stats.output_tokens = _int(usage, "output_tokens")

    def error_event(self, error: dict[str, str]) -> bytes:
        body = {"type": "error", "code": error.get("code"), "message": error.get("message")}
        return _sse({**body, "param": None}, event="error")


_ANTHROPIC_TOKEN = re.compile(r'"(?:text|thinking|partial_json)"\s*:\s*"(?!")')
_ANTHROPIC_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
    }
)
# Our error types (middleware.errors) to Anthropic's documented error types.
_ANTHROPIC_ERROR_TYPES = {"timeout": "timeout_error", "unavailable": "overloaded_error"}


class Anthropic(Dialect):
    """Anthropic Messages: `event: message_start`, `content_block_delta`, ..., `message_stop`."""

    name = "anthropic"
    operation = "chat"

    def is_token(self, event: Event) -> bool:
        return (
            _type(event) == "content_block_delta"
            and _ANTHROPIC_TOKEN.search(event.data) is not None
        )

    def _details(self, event: Event, stats: StreamStats) -> None:
        kind = _type(event)
        if kind == "message_start":
            message = _dict(_loads(event.data, stats), "message")
            _identify(message, stats)
            usage = _dict(message, "usage")
            stats.input_tokens = _int(usage, "input_tokens")
            stats.output_tokens = _int(usage, "output_tokens")
        elif kind == "message_delta":
            obj = _loads(event.data, stats)
            reason = _str(_dict(obj, "delta"), "stop_reason")
            if reason is not None:
                stats.finish_reasons.append(reason)
            usage = _dict(obj, "usage")
            for key in ("input_tokens", "output_tokens"):
                value = _int(usage, key)
                if value is not None:
                    setattr(stats, key, value)
        elif kind == "message_stop":
            stats.done = True

    def error_event(self, error: dict[str, str]) -> bytes:
        kind = _ANTHROPIC_ERROR_TYPES.get(error.get("type", ""), "api_error")
        return _sse(
            {"type": "error", "error": {"type": kind, "message": error.get("message")}},
            event="error",
        )


_TGI_TOKEN = re.compile(r'"token"\s*:\s*\{')
_TGI_TEXT = re.compile(r'"text"\s*:\s*"')
_TGI_SPECIAL = re.compile(r'"special"\s*:\s*(true|false)')
_TGI_FINAL = re.compile(r'"generated_text"\s*:\s*"|"details"\s*:\s*\{')


class TGI(Dialect):
    """Hugging Face text-generation-inference /generate_stream: `data:{"token": {...}, ...}`."""

    name = "tgi"
    operation = "text_completion"

    def is_token(self, event: Event) -> bool:
        data = event.data
        token = _TGI_TOKEN.search(data)
        if token is None:
            return False
        # TGI writes `token` before `top_tokens`, so the first "text" and "special" after the
        # `"token": {` are the token's own.
        text = _TGI_TEXT.search(data, token.end())
        if text is None or data.startswith('"', text.end()):
            return False
        special = _TGI_SPECIAL.search(data, token.end())
        return special is None or special.group(1) == "false"

    def _details(self, event: Event, stats: StreamStats) -> None:
        if _TGI_FINAL.search(event.data) is None:
            return
        obj = _loads(event.data, stats)
        details = _dict(obj, "details")
        reason = _str(details, "finish_reason")
        if reason is not None:
            stats.finish_reasons.append(reason)
        generated = _int(details, "generated_tokens")
        if generated is not None:
            stats.output_tokens = generated
        if isinstance(obj.get("generated_text"), str):
            stats.done = True

    def error_event(self, error: dict[str, str]) -> bytes:
        return _sse({"error": error.get("message"), "error_type": error.get("type")})


GENERIC = Dialect()
OPENAI_CHAT = OpenAIChat()
OPENAI_COMPLETIONS = OpenAICompletions()
OPENAI_RESPONSES = OpenAIResponses()
ANTHROPIC = Anthropic()
TGI_STREAM = TGI()

_BY_PATH_SUFFIX = (
    ("/chat/completions", OPENAI_CHAT),
    ("/completions", OPENAI_COMPLETIONS),
    ("/responses", OPENAI_RESPONSES),
    ("/messages", ANTHROPIC),
    ("/generate_stream", TGI_STREAM),
)


def select(path: str) -> Dialect | None:
    """The dialect for a request path (also under a prefix, e.g. /openai/v1/...), else None."""
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, dialect in _BY_PATH_SUFFIX:
        if path.endswith(suffix):
            return dialect
    return None


def sniff(event: Event) -> Dialect:
    """The dialect from the shape of a stream's first event, when `select` gave None."""
    kind = _type(event)
    if kind.startswith("response."):
        return OPENAI_RESPONSES
    if kind in _ANTHROPIC_EVENTS:
        return ANTHROPIC
    data = event.data
    if '"chat.completion.chunk"' in data or ('"choices"' in data and '"delta"' in data):
        return OPENAI_CHAT
    if '"choices"' in data:
        return OPENAI_COMPLETIONS
    if _TGI_TOKEN.search(data) is not None:
        return TGI_STREAM
    return GENERIC
