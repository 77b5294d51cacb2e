"""The emulator's token text: a built-in English passage and the splitter for custom text.

Tokens are word-ish: a run of whitespace plus the following word, like a BPE token with its
leading space. Splitting works on code points, so a token never ends inside a UTF-8 sequence
and joining the tokens gives the text back byte for byte. Words longer than `MAX_TOKEN_CHARS`
code points (text without spaces, e.g. Chinese) are cut into pieces of that many code points.
"""

from __future__ import annotations

import functools
import json
import re

MAX_TOKEN_CHARS = 16

PASSAGE = (
    "A language model writes its answer one token at a time, and every token travels from the "
    "inference server through proxies, load balancers and gateways before it reaches the "
    "reader. Each hop was built for short requests, so each one is tempted to buffer, to "
    "compress, or to give up after a quiet minute. The reader sees nothing, then everything at "
    "once, or a connection that simply ends. A stream is healthy when bytes flow the moment "
    "they exist, when silence is filled with a small sign of life, when a reader who leaves "
    "stops the work at once, and when every stream leaves one clear record of how it went. "
)

_TOKEN = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> tuple[str, ...]:
    """Split `text` into word-ish tokens whose concatenation is exactly `text`."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        while len(token) > MAX_TOKEN_CHARS:
            tokens.append(token[:MAX_TOKEN_CHARS])
            token = token[MAX_TOKEN_CHARS:]
        tokens.append(token)
    return tuple(tokens)


@functools.lru_cache(maxsize=64)
def token_cycle(text: str) -> tuple[tuple[str, ...], tuple[bytes, ...]]:
    """The tokens of `text` and each one pre-encoded as a JSON string (raw UTF-8, not \\u)."""
    tokens = split_tokens(text)
    return tokens, tuple(json.dumps(t, ensure_ascii=False).encode() for t in tokens)
