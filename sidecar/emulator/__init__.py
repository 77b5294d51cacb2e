"""The built-in upstream emulator: an OpenAI-compatible token streamer that stands in for vLLM.

It is the upstream for `make run`, for the proxy's real-socket tests and for the benchmarks.
Run it with `python -m sidecar.emulator --listen 127.0.0.1:8000` (or `--uds PATH`).

Endpoints:

- `POST /v1/chat/completions`, `POST /v1/completions` — `stream` true or false. Streaming
  sends the OpenAI chunk sequence: a role chunk (chat only), one chunk per content token,
  a chunk with `finish_reason` ("length" when `max_tokens` / `max_completion_tokens` is below
  the planned token count, else "stop"), a usage chunk with `"choices": []` when
  `stream_options.include_usage` is true, then `data: [DONE]`. Non-streaming returns the
  whole completion with usage and a Content-Length, after the time generating would take.
- `GET /v1/stream` — the same chat chunks for EventSource (browsers cannot POST): query
  `ttft_ms`, `itl_ms`, `tokens`, `text`, `max_tokens`, `model`, `stamp`, `include_usage`.
  Content event n carries `id: n`, the finish event `id: <count>`. A `Last-Event-ID: k`
  header resumes at token k+1 (no role chunk); past the finish event the answer is 204,
  which tells EventSource to stop reconnecting.
- `GET /v1/models` (one model, "emulator"; completions echo whatever `model` was asked),
  `GET /health` (200, empty body, like vLLM).
- `GET /debug/stats` — `streams_started/completed/cancelled/active`, `cancel_times` (the
  emulator's `time.monotonic()` when it saw each client leave mid-stream; on Linux that clock
  is shared by all processes of the machine) and `now`. `GET /debug/last-event-id` — the
  last `Last-Event-ID` header seen on any request. In-process: `sidecar.emulator.stats`.

Pacing, per request; later layers win: defaults (200 ms to the first token, 20 ms between
tokens, 64 tokens), then headers `X-Emulator-TTFT-Ms`, `X-Emulator-ITL-Ms`,
`X-Emulator-Tokens`, then the body field `"sidestream": {"ttft_ms", "itl_ms", "tokens",
"text", "stamp", "shape"}`. `shape` picks whose chunks are sent once usage is asked for:
`emulator` (the default: no usage member per chunk), `vllm` (`"usage":null` last in every
chunk), `openai` (`service_tier` and `system_fingerprint` first, `"usage":null` before an
`obfuscation` pad, which the usage chunk carries too). Response headers and the role chunk go at once; the TTFT delay is before
the first content token. `itl_ms: 0` streams as fast as possible, one `send()` per token.
Tokens cycle through a built-in English passage, or `text` split into word-ish tokens on
code points (a given `text` without `tokens` is streamed exactly once). Limits: `tokens` ≤
100000, delays ≤ 600000 ms, body ≤ 4 MiB (413 above).

Benchmarks: the header `X-Emulator-Stamp: 1` (or `"stamp": true`, or `tail`) adds
`"sidestream_sent_ns": <time.monotonic_ns()>` to each content chunk, for one-way latency;
`X-Emulator-Stamp: content` (or `"stamp": "content"`) sends that number as the token's text
instead, so that chunks differ only in their content, as vLLM's do.

Deliberate surprises: the finish chunk, usage chunk and `[DONE]` leave in one write; errors
are OpenAI-shaped JSON (400, 404, 405, 413), never a 500; `n` other than 1 and batched prompts
are refused (one choice per request); token counts are the emulator's own (words), not a real
tokenizer's.
"""

from sidecar.emulator.plan import BadRequest, Plan
from sidecar.emulator.service import MAX_BODY, Emulator, Stats, stats

app = Emulator()


def make_app(
    *, stats: Stats = stats, max_body: int = MAX_BODY, model: str = "emulator"
) -> Emulator:
    """A configured emulator app (the module-level `app` uses the defaults)."""
    return Emulator(stats=stats, max_body=max_body, model=model)


def main(argv: list[str] | None = None) -> int:
    from sidecar.emulator.cli import main as cli_main

    return cli_main(argv)


__all__ = ["BadRequest", "Emulator", "Plan", "Stats", "app", "main", "make_app", "stats"]
