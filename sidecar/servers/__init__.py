"""The traffic and admin listeners: uvicorn (HTTP/1.1) and hypercorn (`--http2`) adapters.

`listener` is what the sidecar needs of either; `uvicorn_listener` and `hypercorn_listener`
build them. The HTTP/1.1 protocol is sidestream's own (`http1`), given to uvicorn by
`Config(http=...)`; every reliance on a server beyond its public interface sits in
`uvicorn_internals` or `hypercorn_internals`, each behind a version gate with a fallback to
the public path.
`body_deadline` keeps `--body-timeout` for the servers that keep none (hypercorn, uvicorn's
public path).
"""
