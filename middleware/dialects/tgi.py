"""Hugging Face text-generation-inference's own /generate_stream."""

from __future__ import annotations

import re

from middleware.dialects.base import Dialect, StreamStats, _dict, _int, _loads, _sse, _str
from middleware.sse import Event

TGI_TOKEN = re.compile(r'"token"\s*:\s*\{')
_TGI_TEXT = re.compile(r'"text"\s*:\s*"')
_TGI_SPECIAL = re.compile(r'"special"\s*:\s*(true|false)')
_TGI_FINAL = re.compile(r'"generated_text"\s*:\s*"|"details"\s*:\s*\{')


class TGI(Dialect):
    """Hugging Face text-generation-inference /generate_stream: `data:{"token": {...}, ...}`."""

    name = "tgi"
    operation = "text_completion"

    def is_token(self, event: Event) -> bool:
        data = event.data
        token = TGI_TOKEN.search(data)
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
