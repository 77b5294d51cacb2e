"""Shutdown: the hooks that let streams finish before the model stops, and the grace they need.

In native mode nothing runs in the model's image. When a pod is deleted the kubelet runs every
container's preStop at once, and SIGTERMs each container when its own hook returns, except a
native sidecar (an init container with restartPolicy Always), which it SIGTERMs only after
every main container has exited. So:

- native: the sidecar's preStop runs in the *sidecar's* image (which has Python): it waits
  out endpoint propagation, then POSTs /drain over loopback and returns. The sidecar drains
  (readiness fails, new requests get 503, running streams get up to drain-timeout) and exits.
  The model's preStop is the kubelet's own `sleep` action (Kubernetes >= 1.30): it keeps the
  model serving for propagation + drain-timeout + margin, then the model gets SIGTERM.
- classic (a plain container, clusters before 1.30): every container gets SIGTERM once its
  hook returns, so the sidecar's preStop only sleeps out propagation and its SIGTERM starts
  the drain. The model's hook is `sleep` run in its image (the `sleep` action does not exist
  before 1.30), the one thing classic mode needs there: coreutils or busybox.

The model's sleep cannot end early: an idle pod takes the whole budget to stop. That is the
price of needing nothing in the model image; a lower drain-timeout shortens it.
"""

from __future__ import annotations

import math
from typing import Any

JSON = dict[str, Any]

# Shutdown budget, in seconds (docs/kubernetes.md's shutdown section):
ENDPOINT_PROPAGATION = 5  # keep serving while Services and load balancers stop routing here
DRAIN_MARGIN = 5  # the sidecar's last terminal events and exit after drain-timeout
MODEL_SHUTDOWN = 10  # the model server's own SIGTERM handling (vLLM --shutdown-timeout)

# Runs in the sidecar's container, native mode. The admin port is on the pod IP for the
# kubelet, but POST /drain answers only loopback there without a token; the hook is on
# loopback. It returns at once: the drain goes on in the sidecar, and a hook still running
# when the sidecar exits would be killed with it (a FailedPreStopHook event). Every step is
# bounded and errors are swallowed: a failed hook must not keep the pod, it only loses the
# drain (the sidecar's SIGTERM still drains what is left once the model has stopped).
DRAIN_SCRIPT = """\
import os, time, urllib.request as u
time.sleep({propagation})
drain = u.Request("http://127.0.0.1:{admin_port}/drain", method="POST")
try:
    u.urlopen(drain, timeout=2)
except Exception:
    pass
os._exit(0)
"""


def model_hold(drain_timeout: float) -> int:
    """Seconds the model keeps serving after deletion: until the sidecar has drained."""
    return ENDPOINT_PROPAGATION + math.ceil(drain_timeout) + DRAIN_MARGIN


def required_grace_period(drain_timeout: float) -> int:
    """Seconds the pod needs between deletion and SIGKILL for a clean drain."""
    return model_hold(drain_timeout) + MODEL_SHUTDOWN


def sidecar_hook(admin_port: int, native: bool) -> JSON:
    """The sidecar's own preStop."""
    if not native:
        return {"exec": {"command": ["sleep", str(ENDPOINT_PROPAGATION)]}}
    script = DRAIN_SCRIPT.format(admin_port=admin_port, propagation=ENDPOINT_PROPAGATION)
    return {"exec": {"command": ["python", "-c", script]}}


def model_hook(drain_timeout: float, native: bool) -> JSON:
    """The preStop for every other container: hold its SIGTERM back while the sidecar drains."""
    seconds = model_hold(drain_timeout)
    if native:
        return {"sleep": {"seconds": seconds}}
    return {"exec": {"command": ["sleep", str(seconds)]}}
