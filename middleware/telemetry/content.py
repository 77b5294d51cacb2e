"""What telemetry reads from a request body and (opt-in) from response events.

Request: the model and sampling parameters (`model`, `stream`, `max_tokens` /
`max_completion_tokens` / `max_output_tokens` / `max_new_tokens`, `temperature`, `top_p`),
read from at most `BODY_CAP` bytes of the body. A body that fits is parsed as JSON (top-level
keys only); a longer one is searched in its first `BODY_CAP` bytes with the same
unescaped-quote regexes as `middleware.dialects` (text inside a JSON string cannot match).
The body itself — the prompt — is never kept.

Response text (only with `capture_content=True`): the content of token events, per dialect,
appended until `limit` characters; the caller joins it into one aggregated completion.
"""

from __future__ import annotations

import json
import re
from typing import Any

from middleware.dialects import json_object
from middleware.sse import Event
from middleware.telemetry import semconv

BODY_CAP = 64 * 1024

_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens")
_STRING = r'"{}"\s*:\s*"([^"\\]{{1,256}})"'
_NUMBER = r'"{}"\s*:\s*(-?[0-9][0-9.eE+-]{{0,24}})'
_PATTERNS = {
    "model": re.compile(_STRING.format("model")),
    "stream": re.compile(r'"stream"\s*:\s*(true|false)'),
    **{key: re.compile(_NUMBER.format(key)) for key in (*_MAX_TOKENS_KEYS, "temperature", "top_p")},
}

Attributes = dict[str, str | bool | int | float]


def request_attributes(body: bytes, complete: bool) -> Attributes:
    """GenAI request attributes from a (possibly truncated) JSON request body."""
    values: dict[str, Any] = {}
    if complete:
        values = json_object(body) or {}
    else:
        text = body.decode("utf-8", "replace")
        for key, pattern in _PATTERNS.items():
            match = pattern.search(text)
            if match is not None:
                raw = match.group(1)
                values[key] = raw if key == "model" else _json_scalar(raw)
    params = values.get("parameters")
    if isinstance(params, dict):  # TGI: {"inputs": ..., "parameters": {...}}
        values = {**params, **values}
    out: Attributes = {}
    model = values.get("model")
    if isinstance(model, str) and model:
        out[semconv.GEN_AI_REQUEST_MODEL] = model[:256]
    stream = values.get("stream")
    if isinstance(stream, bool):
        out[semconv.GEN_AI_REQUEST_STREAM] = stream
    for key in _MAX_TOKENS_KEYS:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[semconv.GEN_AI_REQUEST_MAX_TOKENS] = value
            break
    for key, name in (
        ("temperature", semconv.GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", semconv.GEN_AI_REQUEST_TOP_P),
    ):
        value = values.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _json_scalar(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def event_text(dialect: str, event: Event) -> str:
    """The generated text one event carries, '' when none (or when it is not JSON)."""
    data = event.data
    if not data.startswith("{"):
        return ""
    obj = json_object(data)
    if obj is None:
        return ""
    if dialect.startswith("openai.chat") or dialect == "openai.completions":
        parts = []
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    if dialect == "openai.responses":
        kind = obj.get("type")
        delta = obj.get("delta")
        ok = isinstance(kind, str) and kind.endswith("output_text.delta")
        return delta if ok and isinstance(delta, str) else ""
    if dialect == "anthropic":
        delta = obj.get("delta")
        text = delta.get("text") if isinstance(delta, dict) else None
        return text if isinstance(text, str) else ""
    if dialect == "tgi":
        token = obj.get("token")
        text = token.get("text") if isinstance(token, dict) else None
        special = isinstance(token, dict) and token.get("special") is True
        return text if isinstance(text, str) and not special else ""
    return ""


def output_messages(text: str, finish_reason: str | None) -> str:
    """`gen_ai.output.messages`: one assistant message holding the aggregated text."""
    message = {
        "role": "assistant",
        "parts": [{"type": "text", "content": text}],
        "finish_reason": finish_reason or "error",
    }
    return json.dumps([message], ensure_ascii=False, separators=(",", ":"))
