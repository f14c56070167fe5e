"""`ladder serve` as a user runs it: a subprocess that serves, answers, and drains cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from clients.python import LadderClient, Stopping
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[2]


def test_ladder_serve_answers_then_exits_0_on_sigterm(served_model: Path) -> None:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "clients.python.cli",
        "serve",
        "--model",
        str(served_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--drain-seconds",
        "2",
    ]
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with LadderClient(f"127.0.0.1:{port}") as client:
            assert client.wait_until_serving(60) == "SERVING"
            stopping = Stopping(max_new_tokens=4, ignore_eos=True)
            completion = client.generate("served by the CLI", stopping=stopping)
            assert len(completion.token_ids) == 4
        server.send_signal(signal.SIGTERM)
        logs, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, logs
    events = [line for line in logs.splitlines() if line.startswith("{")]
    assert any('"event": "draining"' in line for line in events)
    assert any('"event": "stopped"' in line for line in events)
