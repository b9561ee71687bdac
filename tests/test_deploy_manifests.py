"""deploy/kubernetes: every overlay renders with kustomize and every object is valid against
the Kubernetes schemas (offline, `kubernetes-validate`). No cluster runs here; what the
manifests promise about the router is checked against its flags and routes instead."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
TARGETS = ["base", "overlays/cpu", "overlays/keda", "overlays/hpa"]
# Custom resources: kubernetes-validate knows only the built-in kinds, so these are checked
# field by field below instead.
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("keda.sh/v1alpha1", "ScaledObject")}
KUBERNETES_VERSION = "1.32.0"


def render(target: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / target)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict], kind: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_is_valid(target):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = render(target)
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM:
            assert obj["metadata"]["name"] and obj["spec"], obj
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def container(objects: list[dict]) -> dict:
    [router] = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return router


def env(objects: list[dict]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objects)["env"]}


def test_the_drain_fits_in_the_grace_period():
    objects = render("base")
    pod = by_kind(objects, "Deployment")["spec"]["template"]["spec"]
    pre_stop = container(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = float(env(objects)["SHUTDOWN_TIMEOUT"])
    assert pre_stop + shutdown < pod["terminationGracePeriodSeconds"]


def test_probes_and_scraping_use_the_routers_routes_and_port():
    objects = render("base")
    router = container(objects)
    port = int(env(objects)["PORT"])
    assert router["ports"][0]["containerPort"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert router[probe]["httpGet"]["path"] == "/health"
    annotations = by_kind(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert router["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env(objects)["HF_HOME"] == router["volumeMounts"][0]["mountPath"]


def test_the_cpu_overlay_asks_for_no_gpu():
    objects = render("overlays/cpu")
    resources = container(objects)["resources"]
    assert "nvidia.com/gpu" not in resources["limits"]
    assert "nvidia.com/gpu" not in resources["requests"]
    assert env(objects)["DEVICE"] == "cpu"


@pytest.mark.parametrize("target", ["overlays/keda", "overlays/hpa"])
def test_autoscaling_reads_the_routers_queue_depth(target):
    objects = render(target)
    text = yaml.safe_dump_all(objects)
    assert "te_queue_size" in text
    scaler = [o for o in objects if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert len(scaler) == 1
    assert scaler[0]["spec"]["scaleTargetRef"]["name"] == "trt-tei-router"
