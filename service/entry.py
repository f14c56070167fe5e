"""`ladder serve` and `python -m service`: flags and LADDER_* environment into the one Config, then serve.

The Config is read and the ports checked before the server's imports (onnxruntime, grpc, the
engine), so a bad flag (exit code 2) or a port another process holds (exit code 1) is refused at once,
in one line on stderr, before anything logs. Once served, the process ends at once (exiting.py):
within the drain grace + 5 s of SIGTERM, however much it has compiled or cached.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from service.config import load_config
from service.ports import PortInUse, check_ports_free


def main(argv: Sequence[str]) -> int:
    """Serve until SIGTERM, then end the process with its exit code (1 after an engine fault: Kubernetes
    must see the pod fail); returns only the exit code of a refusal before serving."""
    config = load_config(argv=argv)
    try:
        check_ports_free(config)  # the server checks again as it binds: one taken since is named there
    except PortInUse as exc:
        print(f"ladder serve: {exc}", file=sys.stderr)
        return 1
    from service.exiting import exit_now
    from service.server import serve

    exit_now(asyncio.run(serve(config)))
