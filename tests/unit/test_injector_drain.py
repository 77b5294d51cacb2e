"""The shutdown budget the injector computes (`sidecar.injector.drain`): the model is held
serving until the sidecar has drained, and the grace period covers the whole sequence. The
hook as a process: tests/system/test_injector_drain_hook.py."""

from __future__ import annotations

import re

import pytest

from sidecar.app import DRAIN_GRACE_SECONDS
from sidecar.injector import InjectorSettings, required_grace_period
from sidecar.injector.drain import (
    ENDPOINT_PROPAGATION,
    MODEL_SHUTDOWN,
    model_hold,
    model_hook,
    sidecar_hook,
)
from sidecar.injector.patch import build_patch, sidecar_container
from sidecar.injector.settings import Mode

HOOK_TIMEOUT = 2  # the drain POST's own timeout in the hook


@pytest.mark.parametrize("drain", [1, 7.5, 30, 30.01, 600])
def test_the_budget_adds_up(drain: float) -> None:
    """Rule: the model is held for propagation + drain-timeout + margin, which outlasts the
    sidecar's drain (the hook's wait and POST, drain-timeout, the terminal events' grace);
    the grace period adds the model's own shutdown on top."""
    sidecar_done = ENDPOINT_PROPAGATION + HOOK_TIMEOUT + drain + DRAIN_GRACE_SECONDS
    assert model_hold(drain) >= sidecar_done
    assert required_grace_period(drain) == model_hold(drain) + MODEL_SHUTDOWN


def test_the_hooks_need_nothing_in_the_model_image() -> None:
    """Rule: native mode holds the model with the kubelet's own sleep action and runs the
    drain in the sidecar's image (Python) on loopback; classic mode runs only `sleep`."""
    assert model_hook(30, native=True) == {"sleep": {"seconds": model_hold(30)}}
    assert model_hook(30, native=False) == {"exec": {"command": ["sleep", str(model_hold(30))]}}
    command = sidecar_hook(9911, native=True)["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert re.findall(r'"(http://[^"]+)"', command[2]) == ["http://127.0.0.1:9911/drain"]
    assert sidecar_hook(9911, native=False) == {
        "exec": {"command": ["sleep", str(ENDPOINT_PROPAGATION)]}
    }


@pytest.mark.parametrize("mode", ["native", "classic"])
@pytest.mark.parametrize("drain", [10.0, 30.0, 300.0])
def test_the_injected_pod_carries_the_budget(mode: Mode, drain: float) -> None:
    """Rule: the patch gives the sidecar its hook, every other container the hold for this
    drain-timeout, and a grace period of at least the budget (raised, never lowered)."""
    settings = InjectorSettings(upstream_port=8000, drain_timeout=drain, mode=mode)
    native = mode == "native"
    for grace in (None, 5, 10_000):
        pod = {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "model", "image": "m"}, {"name": "agent", "image": "a"}],
                **({} if grace is None else {"terminationGracePeriodSeconds": grace}),
            },
        }
        ops, _ = build_patch(pod, settings)
        values = {op["path"]: op["value"] for op in ops}
        for index in (0, 1):
            hook = values[f"/spec/containers/{index}/lifecycle"]["preStop"]
            assert hook == model_hook(drain, native)
        added = values["/spec/initContainers/-" if native else "/spec/containers/-"]
        assert added == sidecar_container(settings)
        assert added["lifecycle"]["preStop"] == sidecar_hook(settings.admin_port, native)
        if grace == 10_000:
            assert "/spec/terminationGracePeriodSeconds" not in values
        else:
            assert values["/spec/terminationGracePeriodSeconds"] == required_grace_period(drain)
