"""The kustomize overlays render, validate against current Kubernetes schemas, and keep
the promises docs/deploy.md makes: gRPC health probes, drain within the grace period,
non-root read-only pods, GPU scheduling, scraping, autoscaling.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys

import pytest
from deploy_support import (
    K8S,
    K8S_VERSION,
    OVERLAYS,
    dockerfile,
    env_of,
    main_container,
    one,
    overlay,
    render,
    schema_errors,
)

HEALTH_SERVICE = "ladder.v1.Ladder"
GRPC_PORT, METRICS_PORT, HTTP_PORT = 50051, 9464, 8000


def pod_spec(name: str) -> dict:
    return one(overlay(name), "Deployment")["spec"]["template"]["spec"]


def test_the_schemas_are_those_of_a_current_kubernetes_release():
    major, minor = (int(x) for x in K8S_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33)


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(name):
    objects = overlay(name)
    assert {o["kind"] for o in objects} == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }
    errors = [e for obj in objects for e in schema_errors(obj)]
    assert errors == []


def test_a_broken_object_is_rejected_by_the_schemas():
    deployment = one(overlay("cpu"), "Deployment")
    assert schema_errors(deployment) == []

    wrong_type = copy.deepcopy(deployment)
    main_container(wrong_type)["readinessProbe"]["grpc"]["port"] = "grpc"
    assert schema_errors(wrong_type), "a grpc probe port must be an integer"

    misspelt = copy.deepcopy(deployment)
    main_container(misspelt)["readinessProbe"]["grpc"]["servce"] = HEALTH_SERVICE
    assert schema_errors(misspelt), "strict validation must reject unknown fields"

    missing = copy.deepcopy(deployment)
    del missing["spec"]["selector"]
    assert schema_errors(missing), "a Deployment needs a selector"

    unknown_kind = {"apiVersion": "v1", "kind": "Pood", "metadata": {"name": "x"}}
    assert schema_errors(unknown_kind), "an object with no schema must not pass silently"


@pytest.mark.parametrize("name", OVERLAYS)
def test_probes_call_grpc_health_on_the_served_port(name):
    container = main_container(one(overlay(name), "Deployment"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == GRPC_PORT, probe
    assert container["startupProbe"]["grpc"]["service"] == HEALTH_SERVICE
    assert container["readinessProbe"]["grpc"]["service"] == HEALTH_SERVICE
    assert container["livenessProbe"]["grpc"]["service"] in {"", HEALTH_SERVICE}
    assert env_of(container)["LADDER_PORT"] == str(GRPC_PORT)


@pytest.mark.parametrize(("name", "budget_s"), [("cpu", 300), ("gpu", 600)])
def test_the_startup_probe_leaves_time_to_prepare_and_load_the_model(name, budget_s):
    probe = main_container(one(overlay(name), "Deployment"))["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= budget_s


@pytest.mark.parametrize("name", OVERLAYS)
def test_liveness_outlasts_the_drain_so_a_draining_pod_is_not_killed(name):
    container = main_container(one(overlay(name), "Deployment"))
    probe = container["livenessProbe"]
    drain = int(env_of(container)["LADDER_DRAIN_SECONDS"])
    assert probe["periodSeconds"] * probe["failureThreshold"] > drain


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_grace_period_covers_the_prestop_sleep_and_the_drain(name):
    spec = pod_spec(name)
    container = main_container(one(overlay(name), "Deployment"))
    sleep_cmd = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep_cmd[0] == "sleep"
    drain = int(env_of(container)["LADDER_DRAIN_SECONDS"])
    assert spec["terminationGracePeriodSeconds"] > int(sleep_cmd[1]) + drain


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_pod_runs_non_root_on_a_read_only_root_with_writable_tmp_and_model_cache(name):
    spec = pod_spec(name)
    container = main_container(one(overlay(name), "Deployment"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"] for v in spec["volumes"]}
    assert mounts["/tmp"] in volumes
    assert mounts[env_of(container)["LADDER_MODEL_CACHE"]] in volumes


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_deployment_runs_the_image_entrypoint_unchanged(name):
    container = main_container(one(overlay(name), "Deployment"))
    assert "command" not in container and "args" not in container


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_pod_name_and_ip_reach_the_server_through_the_downward_api(name):
    env = env_of(main_container(one(overlay(name), "Deployment")))
    assert env["LADDER_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["LADDER_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_the_gpu_overlay_asks_for_one_gpu_and_tolerates_gpu_nodes():
    spec = pod_spec("gpu")
    container = main_container(one(overlay("gpu"), "Deployment"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env_of(container)["LADDER_PROVIDER"] == "cuda"
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert spec["nodeSelector"]
    assert one(overlay("gpu"), "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_the_cpu_overlay_neither_asks_for_nor_tolerates_gpus():
    spec = pod_spec("cpu")
    container = main_container(one(overlay("cpu"), "Deployment"))
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "tolerations" not in spec
    assert env_of(container)["LADDER_PROVIDER"] == "cpu"
    assert container["resources"]["requests"] == container["resources"]["limits"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_openai_http_port_is_served_by_the_pod_and_both_services(name):
    objects = overlay(name)
    container = main_container(one(objects, "Deployment"))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LADDER_HTTP_PORT"] == str(HTTP_PORT)
    assert {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"} in container["ports"]
    for service in (o for o in objects if o["kind"] == "Service"):
        assert any(p["targetPort"] == "http" and p["port"] == HTTP_PORT for p in service["spec"]["ports"])


@pytest.mark.parametrize("name", OVERLAYS)
def test_both_services_select_the_pods_on_named_ports(name):
    objects = overlay(name)
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in main_container(deployment)["ports"]}
    assert one(objects, "Service", "ladder-headless")["spec"]["clusterIP"] == "None"
    assert one(objects, "Service", "ladder")["spec"]["type"] == "ClusterIP"
    for service in (o for o in objects if o["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_disruption_budget_and_autoscaler_govern_the_deployment(name):
    objects = overlay(name)
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


def test_the_gpu_autoscaler_scales_on_the_engine_queue_not_cpu():
    (metric,) = one(overlay("gpu"), "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "ladder_queue_depth"


@pytest.mark.parametrize("name", OVERLAYS)
def test_prometheus_annotations_point_at_the_metrics_port(name):
    template = one(overlay(name), "Deployment")["spec"]["template"]
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(METRICS_PORT)
    assert notes["prometheus.io/path"] == "/metrics"
    (container,) = template["spec"]["containers"]
    assert env_of(container)["LADDER_METRICS_PORT"] == str(METRICS_PORT)


def test_the_servicemonitor_component_scrapes_the_metrics_port_of_the_service(tmp_path):
    # kustomize refuses absolute paths, so the overlay goes into a copy of the tree.
    tree = shutil.copytree(K8S, tmp_path / "k8s")
    monitored = tree / "overlays" / "monitored"
    monitored.mkdir()
    (monitored / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../cpu]\ncomponents: [../../components/servicemonitor]\n"
    )
    objects = render(monitored)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", "ladder")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    metrics = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert metrics["port"] == METRICS_PORT
    # Everything but the CRD-defined ServiceMonitor still validates.
    assert [e for o in objects if o["kind"] != "ServiceMonitor" for e in schema_errors(o)] == []


@pytest.mark.parametrize(("name", "flavour"), [("cpu", "cpu"), ("gpu", "cuda")])
def test_the_init_container_seeds_the_cache_volume_from_the_image_build(name, flavour):
    spec = pod_spec(name)
    (seed,) = spec["initContainers"]
    server = main_container(one(overlay(name), "Deployment"))
    assert seed["image"] == server["image"]
    assert seed["securityContext"]["readOnlyRootFilesystem"] is True
    *_, source, target = seed["command"]
    assert source == dockerfile(flavour).final.env()["LADDER_MODEL_CACHE"]
    assert target == env_of(server)["LADDER_MODEL_CACHE"]
    assert {m["mountPath"]: m["name"] for m in seed["volumeMounts"]}[target] == "model-cache"


def test_the_seed_command_copies_a_prepared_cache_and_can_run_again(tmp_path):
    (seed,) = pod_spec("cpu")["initContainers"]
    interpreter, *program, _, _ = seed["command"]
    assert interpreter == "python"
    built = tmp_path / "image-cache" / "models" / "m"
    built.mkdir(parents=True)
    (built / "model.onnx").write_bytes(b"weights")
    volume = tmp_path / "volume"
    volume.mkdir()
    for _ in range(2):  # a PersistentVolumeClaim is seeded again on every start
        subprocess.run(
            [sys.executable, *program, str(tmp_path / "image-cache"), str(volume)], check=True, timeout=30
        )
    assert (volume / "models" / "m" / "model.onnx").read_bytes() == b"weights"
