"""The upstream's connect failures beyond `middleware.errors`: a timeout (504) and a TLS
handshake failure (502). Both are `UpstreamConnectError`s, so whatever handles a failed
connect handles them; only their status and code differ.
"""

from __future__ import annotations

from middleware.errors import UpstreamConnectError


class UpstreamTimeout(UpstreamConnectError):
    """Connecting to the upstream (TCP and TLS) took longer than `--connect-timeout`."""

    status = 504
    type = "timeout"
    code = "upstream_timeout"
    default_message = "timed out connecting to the upstream"


class UpstreamTLSError(UpstreamConnectError):
    """The TLS handshake with the upstream failed (certificate, protocol version, ALPN)."""

    code = "upstream_tls_error"
    default_message = "TLS with the upstream failed"
