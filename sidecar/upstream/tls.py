"""TLS to the upstream (`https://`): the client context, and what a failed handshake means.

System CAs by default, or `--upstream-ca FILE` instead; SNI and the hostname check use the
upstream's host. `--upstream-insecure` checks nothing and is for tests only: the sidecar
logs a warning line at start when it is on.

Deliberate: a handshake failure is reported with the reason OpenSSL gives (e.g.
"certificate verify failed: self-signed certificate") and nothing else. No key material is
ever in it: the client holds no key, and the CA file's path is all the settings carry.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.upstream.errors import UpstreamTLSError


@dataclass(frozen=True)
class UpstreamTLS:
    """How the sidecar checks the upstream's certificate."""

    ca: str | None = None  # a PEM file of CAs to trust instead of the system's
    insecure: bool = False  # check nothing (tests only)

    def context(self, alpn: Sequence[str]) -> ssl.SSLContext:
        """A client context offering `alpn`; raises OSError/ssl.SSLError for a bad CA file."""
        context = ssl.create_default_context(cafile=self.ca)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(list(alpn))
        return context


def reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason without the source location: "certificate verify failed: ..."."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc.reason or exc.strerror or exc).replace("_", " ").lower()


def tls_error(where: str, exc: ssl.SSLError) -> UpstreamTLSError:
    return UpstreamTLSError(f"TLS with the upstream {where} failed: {reason(exc)}")
