"""sidestream's stream engine: ASGI middleware that keeps LLM token streams healthy."""

from middleware.errors import Outcome, StreamError
from middleware.guard import StreamGuard
from middleware.registry import StreamRegistry

__all__ = ["Outcome", "StreamError", "StreamGuard", "StreamRegistry"]
