"""sidestream's sidecar: a pure-ASGI reverse proxy for inference servers, wrapped by StreamGuard."""
