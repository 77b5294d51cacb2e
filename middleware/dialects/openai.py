"""OpenAI's streams: chat completions, legacy completions and the Responses API (and every
server that speaks them: vLLM, TGI's /v1, llama.cpp)."""

from __future__ import annotations

import re

from middleware.dialects.base import (
    Dialect,
    StreamStats,
    _dict,
    _identify,
    _loads,
    _sse,
    _str,
    _type,
    _usage,
)
from middleware.speedups import Frame, first_token
from middleware.sse import CR, Event

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

    def __init__(self) -> None:
        # `is_token`'s needles as bytes, for `first_token` (instance fields: read per call).
        self._literal_bytes = self._literal.encode()
        self._keys_bytes = tuple(key.encode() for key in self._token_keys)

    def first_token(self, parts: list[bytes]) -> bool | None:
        """`is_token`'s rule on each event's bytes (`frame.first_token`, compiled where
        built): a stream's first token found without its events made, the regex's cases
        excepted (None)."""
        return first_token(parts, self._literal_bytes, self._keys_bytes)

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
        _usage(stats, obj, "prompt_tokens", "completion_tokens")


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
        _usage(stats, response, "input_tokens", "output_tokens")

    def error_event(self, error: dict[str, str]) -> bytes:
        body = {"type": "error", "code": error.get("code"), "message": error.get("message")}
        return _sse({**body, "param": None}, event="error")
