"""The SDK's OTLP/HTTP span exporter, sending what `otlp_encoder` writes.

`OTLPSpanExporter` is the SDK's exporter — endpoint, headers, TLS, compression, timeout and
retries stay its own — with sidestream's encoder in front of its HTTP client, and given spans
that direct spans wrote already (`otlp_encoder.EncodedSpan`). That client is not public API
(`otel_sdk`): with an SDK version not checked, or one that lays the exporter out differently,
the exporter is the SDK's own (`fast` is false: its `export`, its encoder; correct, only
slower), and `tests/test_telemetry_otlp.py` pins the fast path to the installed version.

Where nothing but the endpoint matters (plain HTTP, no proxy, netrc file or credential
provider: `plain_http_transport`) it sends through the SDK's urllib3 transport instead of its
default, `requests`, which re-reads the environment and the netrc file and merges settings and
hooks on every request: the same request for a fraction of the CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as SDKSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from middleware.telemetry import otel_sdk
from middleware.telemetry.otlp_encoder import EncodedSpan, Encoder, encode_spans

__all__ = ["EncodedSpan", "OTLPSpanExporter", "encode_spans", "plain_http_transport"]

logger = logging.getLogger("sidestream")


class OTLPSpanExporter(SDKSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with `otlp_encoder` (see the module doc),
    over the SDK's urllib3 transport where `plain_http_transport` allows it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args and not otel_sdk.transport_chosen(kwargs):
            transport = plain_http_transport(kwargs.get("endpoint"))
            if transport is not None:
                kwargs.update(otel_sdk.exporter_arguments(transport))
        super().__init__(*args, **kwargs)
        self._encoder = Encoder()
        self.fast = otel_sdk.sends_bytes(self)

    def export(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> SpanExportResult:
        if not self.fast or otel_sdk.is_shut_down(self):  # (no EncodedSpan when not fast)
            return super().export(spans)  # type: ignore[arg-type]
        try:
            data = self._encoder.request(spans)
        except Exception:  # never lose a batch to the encoder: the SDK's own path
            logger.exception("OTLP: fast span encoding failed; using the SDK's encoder")
            plain = [span for span in spans if not isinstance(span, EncodedSpan)]
            if len(plain) < len(spans):
                logger.error("OTLP: %d spans lost with the batch", len(spans) - len(plain))
            return super().export(plain)
        sent = otel_sdk.send(self, data)
        return SpanExportResult.SUCCESS if sent else SpanExportResult.FAILURE


# What `requests` reads from the environment for a plain-HTTP URL, and the SDK's credential
# provider variables (a provider brings its own `requests.Session`).
_PROXIES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
_CREDENTIALS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)


def plain_http_transport(
    endpoint: str | None, environ: Mapping[str, str] | None = None
) -> Any | None:
    """The SDK's urllib3 transport for a span endpoint where it sends what its default
    (`requests`) would, else None (keep the default).

    What `requests` reads on every request only matters for some endpoints, so urllib3 is
    used when none of it applies: the endpoint (as given, else from the OTEL_* variables) is
    plain `http://` (no CA or client certificate), no proxy variable is set, no netrc file
    exists, and no credential provider is configured. None too where `otel_sdk` has no
    urllib3 transport to give (a version not checked, or the private module missing)."""
    env = os.environ if environ is None else environ
    url = (
        endpoint
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4318/"
    )
    if (
        not url.lower().startswith("http://")
        or any(env.get(name) for name in _PROXIES + _CREDENTIALS)
        or _netrc(env)
    ):
        return None
    return otel_sdk.urllib3_transport()


def _netrc(env: Mapping[str, str]) -> bool:
    """Would `requests` find a netrc file (and so maybe credentials) for a request?"""
    if env.get("NETRC"):
        return True
    home = env.get("HOME") or os.path.expanduser("~")
    return any(os.path.exists(os.path.join(home, name)) for name in (".netrc", "_netrc"))
