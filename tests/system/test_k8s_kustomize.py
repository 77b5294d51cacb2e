"""`kubectl kustomize` builds each kustomization under k8s/ (kubectl is required: .ci/run
installs it); every resource it outputs passes tests/unit/test_k8s_manifests.py's checks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_k8s_manifests import KUSTOMIZATIONS, check_model_deployment, rel, validate

MODEL_DEPLOYMENTS = ("vllm", "llama-cpp")  # k8s/base and k8s/overlays/llamacpp


@pytest.mark.parametrize("root", KUSTOMIZATIONS, ids=rel)
def test_kustomize_build_validates(root: Path) -> None:
    """`kubectl kustomize` builds each kustomization; every output resource validates."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is not installed (.ci/run installs it)"
    kind = yaml.safe_load((root / "kustomization.yaml").read_text())["kind"]
    if kind == "Component":  # built through the overlays that use it
        users = [
            k
            for k in KUSTOMIZATIONS
            for c in yaml.safe_load((k / "kustomization.yaml").read_text()).get("components", [])
            if (k / c).resolve() == root.resolve()
        ]
        assert users, f"no overlay uses the component {rel(root)}"
        return
    built = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert docs
    for doc in docs:
        validate(doc)
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in MODEL_DEPLOYMENTS:
            check_model_deployment(doc, docs)
