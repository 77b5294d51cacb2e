"""The upstream's connect failures beyond `middleware.errors`: a timeout (504) and a TLS
handshake failure (502). Both are `UpstreamConnectError`s, so whatever handles a failed
connect handles them; only their status and code differ.
"""

from __future__ import annotations

from middleware.errors import UpstreamConnectError, UpstreamError


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


class RequestFramingError(UpstreamError):
    """A request head or body the proxy would send upstream breaks the framing invariant
    (`sidecar.upstream.framing`): refused before the bytes go out. Reaching it is a bug in
    a path that built the request, never the client's doing (those get 400 first)."""

    code = "request_framing_refused"
    default_message = "refusing to send a request whose framing does not match its body"
