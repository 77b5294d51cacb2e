"""Secrets by reference: an annotation names a Kubernetes Secret, never holds the value.

`sidestream.dev/<setting>: NAME` or `NAME/KEY` mounts that one key of Secret NAME read-only
into the sidecar alone and points the sidecar's `*_FILE` variable at it. A value in an
annotation would be readable by anyone who may read the pod, in every copy of the pod spec
(ReplicaSets, audit logs, `kubectl describe`); a Secret has its own RBAC and stays out of
them. The injector never reads the Secret (it has no API access): a missing one keeps the
pod in ContainerCreating with the kubelet's event naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

MOUNT_ROOT = "/var/run/secrets/sidestream"

# setting -> (the sidecar's variable, the key used when the annotation names none)
SECRET_SETTINGS = {
    "resume-secret": ("SIDESTREAM_RESUME_SECRET_FILE", "secret"),
    "resume-store-password": ("SIDESTREAM_RESUME_STORE_PASSWORD_FILE", "password"),
    "admin-token": ("SIDESTREAM_ADMIN_TOKEN_FILE", "token"),
}
# A Secret's name is a DNS subdomain; a key is what a Secret's data may be keyed by.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True)
class SecretRef:
    setting: str  # the annotation's name without the prefix, e.g. "resume-secret"
    secret: str
    key: str

    @property
    def volume_name(self) -> str:
        return f"sidestream-{self.setting}"

    @property
    def path(self) -> str:
        return f"{MOUNT_ROOT}/{self.setting}/{self.key}"

    def volume(self) -> dict[str, Any]:
        """Only this key of the Secret is projected: the sidecar sees nothing else in it."""
        return {
            "name": self.volume_name,
            "secret": {"secretName": self.secret, "items": [{"key": self.key, "path": self.key}]},
        }

    def mount(self) -> dict[str, Any]:
        return {
            "name": self.volume_name,
            "mountPath": f"{MOUNT_ROOT}/{self.setting}",
            "readOnly": True,
        }

    def env(self) -> dict[str, str]:
        return {"name": SECRET_SETTINGS[self.setting][0], "value": self.path}


def parse_secret_refs(ours: dict[str, str], prefix: str, problems: list[str]) -> list[SecretRef]:
    refs = []
    for setting, (_, default_key) in SECRET_SETTINGS.items():
        if setting not in ours:
            continue
        name, _, key = ours[setting].strip().partition("/")
        key = key or default_key
        if len(name) > 253 or not _NAME.match(name) or not _KEY.match(key):
            # Not echoed: someone may have pasted the secret itself here.
            problems.append(
                f"{prefix}{setting}: expected the name of a Secret in the pod's namespace, "
                f"NAME or NAME/KEY (key {default_key!r} when none is given), not a value"
            )
            continue
        refs.append(SecretRef(setting, name, key))
    return refs


def url_password(url: str) -> bool:
    """Whether a Redis URL carries a password, in its user part or its query."""
    try:
        parts = urlsplit(url)
        if parts.password:
            return True
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return False
    return any("password" in unquote(name).lower() for name, _ in query)
