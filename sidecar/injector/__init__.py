"""sidestream's mutating admission webhook: injects the sidecar into labelled pods.

`python -m sidecar.injector --listen HOST:PORT [--certfile F --keyfile F]` serves
`POST /mutate` (AdmissionReview v1 in, AdmissionReview with a JSONPatch out) and
`GET /livez`. Opt-in by the pod label `sidestream.dev/inject: "true"` (the webhook's
objectSelector does the filtering; the app never sees other pods), settings by
`sidestream.dev/*` annotations (see `settings.py`; sizing, secrets by reference and the
drain budget in their own modules). The decisions are pure functions (`parse_settings`,
`build_patch`, `declared_patch`); `app.py` only speaks AdmissionReview.
"""

from sidecar.injector.app import InjectorApp, InvalidPolicy
from sidecar.injector.drain import required_grace_period
from sidecar.injector.patch import build_patch
from sidecar.injector.settings import InjectorSettings, InvalidAnnotation, parse_settings

__all__ = [
    "InjectorApp",
    "InjectorSettings",
    "InvalidAnnotation",
    "InvalidPolicy",
    "build_patch",
    "parse_settings",
    "required_grace_period",
]
