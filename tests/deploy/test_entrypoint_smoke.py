"""The image's entrypoint, started with the pod's environment, passes the kubelet's probes.

No cluster and no docker: the command is read from Dockerfile.cpu (ENTRYPOINT + CMD),
the environment from the rendered cpu Deployment (ports, model and cache moved to
free ports and a temporary directory), and the probes are the Deployment's own:
grpc.health.v1.Health/Check on the probe's service name with the probe's timeout,
which is all a kubelet's native gRPC probe does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from deploy_support import dockerfile, main_container, one, overlay
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.servers import free_port
from tests.support.waiting import wait_for

STARTUP_DEADLINE_S = 90
DRAIN_SECONDS = 2
SERVING = health_pb2.HealthCheckResponse.SERVING


def entrypoint() -> list[str]:
    command = dockerfile("cpu").entrypoint_command()
    # The image puts its venv first on PATH; here the test's venv is that venv.
    local = Path(sys.executable).parent / command[0]
    found = str(local) if local.exists() else shutil.which(command[0])
    assert found, f"`{command[0]}` is not installed: run `pip install -e .`"
    return [found, *command[1:]]


def pod_environment(tmp_path: Path, model_dir: Path, port: int, metrics_port: int) -> dict:
    """The cpu pod's env, with what only a pod has (ports, paths, name) made local."""
    container = main_container(one(overlay("cpu"), "Deployment"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env |= {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {
        "LADDER_POD_NAME": "ladder-smoke-0",
        "LADDER_HOST": "127.0.0.1",
        "LADDER_PORT": str(port),
        "LADDER_METRICS_PORT": str(metrics_port),
        "LADDER_HTTP_PORT": str(free_port()),  # the HTTP API starts too, on a port of its own
        "LADDER_MODEL": str(model_dir),
        "LADDER_MODEL_CACHE": str(tmp_path / "cache"),
        "LADDER_DRAIN_SECONDS": str(DRAIN_SECONDS),
        "HOME": str(tmp_path),
    }
    return env


def probe(port: int, service: str, timeout_s: float) -> int | None:
    """One kubelet gRPC probe: the health status, or None if the server did not answer."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
        return reply.status


@pytest.fixture
def server(tmp_path: Path, served_model: Path):
    port, metrics_port = free_port(), free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        entrypoint(),
        env=pod_environment(tmp_path, served_model, port, metrics_port),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        yield proc, port, metrics_port, tmp_path / "server.log"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_the_entrypoint_passes_startup_readiness_and_liveness_probes_then_drains(server):
    proc, port, metrics_port, log = server
    probes = main_container(one(overlay("cpu"), "Deployment"))
    startup = probes["startupProbe"]

    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while probe(port, startup["grpc"]["service"], startup["timeoutSeconds"]) != SERVING:
        assert proc.poll() is None, f"`ladder serve` exited early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"never SERVING:\n{log.read_text()}"
        time.sleep(0.25)

    for name in ("readinessProbe", "livenessProbe"):
        check = probes[name]
        assert probe(port, check["grpc"]["service"], check["timeoutSeconds"]) == SERVING, name

    # The gpu autoscaler's custom metric must be among what the pod exports.
    (hpa_metric,) = one(overlay("gpu"), "HorizontalPodAutoscaler")["spec"]["metrics"]
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert f"\n{hpa_metric['pods']['metric']['name']} " in reply.read().decode()

    proc.send_signal(signal.SIGTERM)
    readiness = probes["readinessProbe"]
    # Readiness flips once the process has the signal: wait for that, not for a time.
    wait_for(lambda: probe(port, readiness["grpc"]["service"], readiness["timeoutSeconds"]) != SERVING)
    # A drain that finishes is a clean exit; dying of the signal would cut streams.
    assert proc.wait(timeout=DRAIN_SECONDS + 10) == 0, log.read_text()
