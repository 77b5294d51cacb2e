"""The upstream clients: `types` (what they share), `h1` + `h1pool` (HTTP/1.1 on httptools),
`h2` (h2c on httpcore, its private internals in `httpcore_internals`), `pools` (`make_pool`).

Deliberately empty: importing a submodule never loads the others through this package.
"""
