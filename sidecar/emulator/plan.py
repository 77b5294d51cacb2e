"""Turn one emulator request into a `Plan`: what to stream, how much, and how fast.

Pure functions, no I/O. Every bad input raises `BadRequest`, which the app turns into an
OpenAI-style JSON error. Pacing comes from three layers, later wins: defaults, then the
`X-Emulator-*` request headers, then the body's `"sidestream"` object (or, for
`GET /v1/stream`, the query string).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl

from sidecar.emulator.text import PASSAGE, token_cycle

Kind = Literal["chat", "completion"]
# Where a content chunk carries its send time (`time.monotonic_ns()`, for one-way latency):
# "tail", a top-level "sidestream_sent_ns" after the choices (so every chunk's tail differs,
# as OpenAI's obfuscation pad makes it), or "content", as the token's text (so chunks differ
# only in their content, exactly as vLLM, TGI and llama.cpp send them).
Stamp = Literal["tail", "content"]

DEFAULT_MODEL = "emulator"
DEFAULT_TTFT_MS = 200.0
DEFAULT_ITL_MS = 20.0
DEFAULT_TOKENS = 64
MAX_TOKENS = 100_000
MAX_DELAY_MS = 600_000.0
PACING_FIELDS = frozenset({"ttft_ms", "itl_ms", "tokens", "text", "stamp", "shape"})
# Whose chunks, as they are with `stream_options.include_usage`: the emulator's own (no
# usage member per chunk), vLLM's (`"usage":null` last in every chunk) or OpenAI's
# (`service_tier`, `system_fingerprint`, then `"usage":null` before an `obfuscation` pad).
SHAPES = ("emulator", "vllm", "openai")


class BadRequest(Exception):
    """A request the emulator refuses; `status` is 400 unless said otherwise."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class Headers:
    """The request headers the emulator reads, raw (None when absent)."""

    ttft_ms: str | None = None
    itl_ms: str | None = None
    tokens: str | None = None
    stamp: str | None = None
    last_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    text: str  # the token cycle's source text
    count: int  # content tokens to emit
    finish_reason: str  # "stop", or "length" when max_tokens cut the planned count
    ttft: float  # seconds from response headers to the first content token
    itl: float  # seconds between content tokens
    stamp: Stamp | None  # each content chunk's send time: where it goes (see `_stamp`)
    prompt_tokens: int
    # vLLM's `stream_options.continuous_usage_stats`: usage so far on every content chunk.
    continuous_usage: bool = False
    shape: str = "emulator"  # `SHAPES`


def plan_post(kind: Kind, raw: bytes, headers: Headers) -> Plan:
    """Plan a `POST /v1/chat/completions` (kind "chat") or `/v1/completions` request."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("Request body is nested too deeply.") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    prompt_tokens = _messages(body) if kind == "chat" else _prompt(body)
    model = body.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string.", "model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean.", "stream")
    if body.get("n") not in (None, 1):
        raise BadRequest("The emulator generates one choice per request: 'n' must be 1.", "n")
    include_usage = _stream_options(body.get("stream_options"), stream)
    max_tokens = body.get("max_completion_tokens")
    param = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = body.get("max_tokens"), "max_tokens"
    if max_tokens is not None:
        max_tokens = _integer(max_tokens, param, 1, None)
    pacing = body.get("sidestream")
    if pacing is not None and not isinstance(pacing, dict):
        raise BadRequest("'sidestream' must be an object.", "sidestream")
    for key in pacing or ():
        if key not in PACING_FIELDS:
            raise BadRequest(f"Unknown pacing field 'sidestream.{key}'.", f"sidestream.{key}")
    plan = _plan(kind, model, stream, include_usage, max_tokens, prompt_tokens, headers, pacing)
    options = body.get("stream_options")
    if include_usage and isinstance(options, dict) and options.get("continuous_usage_stats"):
        plan = dataclasses.replace(plan, continuous_usage=True)
    shape = (pacing or {}).get("shape", "emulator")
    if shape not in SHAPES:
        raise BadRequest(
            f"'sidestream.shape' must be one of {', '.join(SHAPES)}.", "sidestream.shape"
        )
    return dataclasses.replace(plan, shape=shape) if shape != "emulator" else plan


def plan_get(query: bytes, headers: Headers) -> tuple[Plan, int]:
    """Plan a `GET /v1/stream`; also return the first token index (after Last-Event-ID)."""
    try:
        params = dict(parse_qsl(query.decode(), keep_blank_values=True, errors="strict"))
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("The query string is not valid UTF-8.") from None
    pacing: dict[str, Any] = {}
    for key in ("ttft_ms", "itl_ms"):
        if key in params:
            pacing[key] = _parse_float(params[key], key)
    if "tokens" in params:
        pacing["tokens"] = _parse_int(params["tokens"], "tokens")
    if "text" in params:
        pacing["text"] = params["text"]
    if "stamp" in params:
        pacing["stamp"] = params["stamp"]
    max_tokens = None
    if "max_tokens" in params:
        max_tokens = _integer(_parse_int(params["max_tokens"], "max_tokens"), "max_tokens", 1, None)
    model = params.get("model") or DEFAULT_MODEL
    include_usage = params.get("include_usage", "") not in ("", "0", "false")
    plan = _plan("chat", model, True, include_usage, max_tokens, 1, headers, pacing)
    start = 0
    if headers.last_event_id is not None:
        try:
            start = max(int(headers.last_event_id.strip()) + 1, 0)
        except ValueError:
            start = 0  # like a browser's first connect: an unusable id starts over
    return plan, start


def _plan(
    kind: Kind,
    model: str,
    stream: bool,
    include_usage: bool,
    max_tokens: int | None,
    prompt_tokens: int,
    headers: Headers,
    pacing: dict[str, Any] | None,
) -> Plan:
    pacing = pacing or {}
    ttft = DEFAULT_TTFT_MS
    itl = DEFAULT_ITL_MS
    tokens: int | None = None
    if headers.ttft_ms is not None:
        ttft = _delay(_parse_float(headers.ttft_ms, "X-Emulator-TTFT-Ms"), "X-Emulator-TTFT-Ms")
    if headers.itl_ms is not None:
        itl = _delay(_parse_float(headers.itl_ms, "X-Emulator-ITL-Ms"), "X-Emulator-ITL-Ms")
    if headers.tokens is not None:
        tokens = _integer(_parse_int(headers.tokens, "X-Emulator-Tokens"), "X-Emulator-Tokens")
    if "ttft_ms" in pacing:
        ttft = _delay(pacing["ttft_ms"], "sidestream.ttft_ms")
    if "itl_ms" in pacing:
        itl = _delay(pacing["itl_ms"], "sidestream.itl_ms")
    if "tokens" in pacing:
        tokens = _integer(pacing["tokens"], "sidestream.tokens")
    text = pacing.get("text", PASSAGE)
    if not isinstance(text, str) or not text:
        raise BadRequest("'sidestream.text' must be a non-empty string.", "sidestream.text")
    stamp = None if headers.stamp is None else _stamp(headers.stamp.strip(), "X-Emulator-Stamp")
    if "stamp" in pacing:
        stamp = _stamp(pacing["stamp"], "sidestream.stamp")
    if tokens is None:
        tokens = DEFAULT_TOKENS if "text" not in pacing else len(token_cycle(text)[0])
    count, finish = tokens, "stop"
    if max_tokens is not None and max_tokens < tokens:
        count, finish = max_tokens, "length"
    return Plan(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=include_usage,
        text=text,
        count=count,
        finish_reason=finish,
        ttft=ttft / 1000,
        itl=itl / 1000,
        stamp=stamp,
        prompt_tokens=prompt_tokens,
    )


def _messages(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", "messages")
    words = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a 'role'.", f"messages[{i}]")
        content = message.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += len(part["text"].split())
        elif content is not None:
            raise BadRequest(
                f"'messages[{i}].content' must be a string or an array.", f"messages[{i}].content"
            )
    return words + 3 * len(messages)  # a few template tokens per message, like a chat template


def _prompt(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return max(len(prompt.split()), 1)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return len(prompt)
    raise BadRequest(
        "'prompt' must be a string or an array of token ids (one prompt per request).", "prompt"
    )


def _stream_options(options: object, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise BadRequest(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options"
        )
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object.", "stream_options")
    include = options.get("include_usage", False)
    if include is None:
        return False
    if not isinstance(include, bool):
        raise BadRequest(
            "'stream_options.include_usage' must be a boolean.", "stream_options.include_usage"
        )
    return include


def _integer(value: object, param: str, low: int = 0, high: int | None = MAX_TOKENS) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"'{param}' must be an integer.", param)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"'{param}' must be {bounds}, got {value}.", param)
    return value


def _delay(value: object, param: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise BadRequest(f"'{param}' must be a number of milliseconds.", param)
    if not 0 <= value <= MAX_DELAY_MS:
        raise BadRequest(f"'{param}' must be between 0 and {MAX_DELAY_MS:.0f} ms.", param)
    return float(value)


def _stamp(value: object, param: str) -> Stamp | None:
    """A stamp setting: JSON true/false, or a header or query value (`1`/`true`/`tail`,
    `content`, or `0`/`false`/empty for none)."""
    if value is False or value in ("", "0", "false"):
        return None
    if value is True or value in ("1", "true", "tail"):
        return "tail"
    if value == "content":
        return "content"
    raise BadRequest(f'\'{param}\' must be true, false, "tail" or "content".', param)


def _parse_float(raw: str, param: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise BadRequest(f"'{param}' must be a number of milliseconds.", param) from None


def _parse_int(raw: str, param: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"'{param}' must be an integer.", param) from None
