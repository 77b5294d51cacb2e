"""sidestream's stream engine: ASGI middleware that keeps LLM token streams healthy."""
