"""Kubernetes resource quantities, and the engine options that enforce a container's limits as the kubelet does."""

from __future__ import annotations

import pytest

from pipeline.manifests import ManifestError, engine_limit_args, quantity


@pytest.mark.parametrize("text, value", [("500m", 0.5), ("1", 1.0), ("1.5", 1.5), (2, 2.0), ("2Gi", 2 * 2**30),
                                         ("768Mi", 768 * 2**20), ("1G", 1e9), ("64Ki", 65536.0)])
def test_quantities_read_as_kubernetes_does(text, value):
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "1e3", "two", "1 Gi", "-1", "1Gb"])
def test_unreadable_quantities_are_refused(text):
    with pytest.raises(ManifestError, match="Kubernetes quantity"):
        quantity(text)


def test_limits_become_a_cpu_quota_and_a_memory_limit_without_swap():
    assert engine_limit_args({"cpu": "1500m", "memory": "1Gi"}) == [
        "--cpus", "1.5", "--memory", f"{2**30}b", "--memory-swap", f"{2**30}b"]
    assert engine_limit_args({}) == []


def test_the_runtime_and_the_inference_service_ask_for_the_same_resources():
    """KServe merges the InferenceService's resources over the runtime's: both say what was measured."""
    from pipeline.kserve_deploy import PREDICTOR_CPU, PREDICTOR_MEMORY, inference_service
    from support.containers import runtime_container

    runtime = runtime_container()["resources"]
    manifest = inference_service("embedding", "models", "s3://models/embedding/1.0", "v1", "embedding", "1.0")
    model = manifest["spec"]["predictor"]["model"]["resources"]
    want = {"cpu": quantity(PREDICTOR_CPU), "memory": quantity(PREDICTOR_MEMORY)}
    for resources in (runtime, model):
        for kind in ("requests", "limits"):
            assert {k: quantity(v) for k, v in resources[kind].items()} == want, (kind, resources)
