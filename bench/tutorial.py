"""The reference "tutorial" proxy: FastAPI + httpx.AsyncClient + StreamingResponse.

What a typical blog post writes to put a proxy in front of an LLM server, for comparison
only. Deliberately left as tutorials leave it: one shared `httpx.AsyncClient(timeout=None)`
with httpx's default pool limits (100 connections), `aiter_raw()` into a StreamingResponse.
Upstream from the env var `BENCH_UPSTREAM`. Run: `uvicorn bench.tutorial:app`.
"""

from __future__ import annotations

import os

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:8000")
HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}

app = FastAPI()
client = httpx.AsyncClient(base_url=UPSTREAM, timeout=None)


@app.post("/v1/chat/completions")
async def chat(request: Request) -> StreamingResponse:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    upstream = client.build_request(
        "POST", "/v1/chat/completions", content=await request.body(), headers=headers
    )
    response = await client.send(upstream, stream=True)
    return StreamingResponse(
        response.aiter_raw(),
        status_code=response.status_code,
        media_type=response.headers.get("content-type"),
        background=BackgroundTask(response.aclose),
    )
