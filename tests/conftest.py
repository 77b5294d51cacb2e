"""The four test tiers, one directory each; a test's tier marker comes from its directory.

- `unit/`: pure functions, state machines, parsers, config, manifests and fixtures: no socket,
  no server, no subprocess;
- `asgi/`: apps driven in-process through hand-written `receive`/`send`;
- `sockets/`: real servers on 127.0.0.1 free ports in this process (uvicorn, hypercorn, the
  emulator), raw asyncio clients, the openai SDK;
- `system/`: child processes and outside programs (the sidecar CLI, nginx, Chromium,
  kubectl, atheris, the soak, h2load, llama.cpp's server).

Helpers shared by the tiers (and by `bench/`) live in `tests/support/`. `pytest -m "unit or
asgi"` (or `make test-fast`) runs the two quick tiers, which need nothing but `.venv`; the
sockets tier also runs redis-server, the system tier the rest. `make test-deps` installs them,
and a test whose program is missing fails naming it (`tests/support/tools.py`), never skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.redis import RedisServer, redis_server

TIERS = ("unit", "asgi", "sockets", "system")
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the tier its directory names; a test outside the tiers is an error."""
    for item in items:
        parts = item.path.relative_to(HERE).parts
        tier = parts[0] if len(parts) > 1 else None
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test belongs under tests/<tier>/: {TIERS}")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
async def redis() -> AsyncIterator[RedisServer]:
    """A throwaway redis-server for the test (`tests/support/redis.py`)."""
    async with redis_server() as server:
        yield server
