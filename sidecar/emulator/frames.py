"""Pre-encoded SSE frames in the exact OpenAI / vLLM chunk shapes.

Everything that does not change per token is encoded once per request (`Frames`), so a
content chunk is `head + token_json + tail + end`: bytes concatenation, no `json.dumps` per
token. Token JSON strings are pre-encoded once per distinct text (`text.token_cycle`).
"""

from __future__ import annotations

import json
import time
import uuid

from sidecar.emulator.plan import Plan

DONE = b"data: [DONE]\n\n"
END = b"}\n\n"
STAMP = b',"sidestream_sent_ns":%d'
STAMP_END = STAMP + END  # the emulator's own shape's stamped end (bench/lab reads it)
OPENAI_HEAD = b'"service_tier":"default","system_fingerprint":"fp_emulator",'
OBFUSCATION = b',"obfuscation":"Zq3"'
USAGE_FIELD = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}'


class Frames:
    """The frames of one response. A content chunk is `head + token + tail + end`."""

    __slots__ = ("_prefix", "end", "head", "kind", "pad", "role", "tail")

    def __init__(self, plan: Plan) -> None:
        self.kind = plan.kind
        ident = ("chatcmpl-" if plan.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion.chunk" if plan.kind == "chat" else "text_completion"
        openai = plan.shape == "openai"
        self._prefix = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,%b"choices":' % (
            ident.encode(),
            obj.encode(),
            int(time.time()),
            json.dumps(plan.model, ensure_ascii=False).encode(),
            OPENAI_HEAD if openai else b"",
        )
        # What follows a chunk's choices: `"usage":null` where vLLM and OpenAI write it once
        # usage is asked for (not with vLLM's continuous usage: the service adds that), and
        # OpenAI's pad (`pad`, which its usage chunk carries too).
        self.pad = OBFUSCATION if openai else b""
        null = plan.include_usage and not plan.continuous_usage and plan.shape != "emulator"
        self.end = (b',"usage":null' if null else b"") + self.pad + END
        if plan.kind == "chat":
            self.head = self._prefix + b'[{"index":0,"delta":{"content":'
            self.tail = b'},"logprobs":null,"finish_reason":null}]'
            self.role: bytes | None = (
                self._prefix + b'[{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]' + self.end
            )
        else:
            self.head = self._prefix + b'[{"index":0,"text":'
            self.tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]'
            self.role = None  # completions have no role chunk

    def finish(self, reason: str) -> bytes:
        if self.kind == "chat":
            choice = b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"%s"}]'
        else:
            choice = (
                b'[{"index":0,"text":"","logprobs":null,"finish_reason":"%s","stop_reason":null}]'
            )
        return self._prefix + choice % reason.encode() + self.end

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (
            self._prefix
            + b'[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}'
            % (
                prompt_tokens,
                completion_tokens,
                prompt_tokens + completion_tokens,
            )
            + self.pad
            + END
        )


def full_response(plan: Plan, text: str) -> bytes:
    """The non-streaming completion object, with usage."""
    usage = {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.count,
        "total_tokens": plan.prompt_tokens + plan.count,
    }
    choice: dict[str, object]
    if plan.kind == "chat":
        ident, obj = "chatcmpl-" + uuid.uuid4().hex, "chat.completion"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        ident, obj = "cmpl-" + uuid.uuid4().hex, "text_completion"
        choice = {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason=plan.finish_reason)
    body = {
        "id": ident,
        "object": obj,
        "created": int(time.time()),
        "model": plan.model,
        "choices": [choice],
        "usage": usage,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
