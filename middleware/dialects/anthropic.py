"""Anthropic Messages streams."""

from __future__ import annotations

import re

from middleware.dialects.base import (
    Dialect,
    StreamStats,
    _dict,
    _identify,
    _int,
    _loads,
    _sse,
    _str,
    _type,
    _usage,
)
from middleware.sse import Event

_ANTHROPIC_TOKEN = re.compile(r'"(?:text|thinking|partial_json)"\s*:\s*"(?!")')
ANTHROPIC_EVENTS = frozenset(
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
            _usage(stats, message, "input_tokens", "output_tokens")
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
