"""`ladder serve` and `python -m service`: flags and LADDER_* environment into the one Config, then serve.

The Config is read before the server's imports (onnxruntime, grpc, the engine), so a bad flag is
refused at once (exit code 2) instead of after them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from service.config import load_config


def main(argv: Sequence[str]) -> int:
    """Serve until SIGTERM; the exit code (1 after an engine fault: Kubernetes must see the pod fail)."""
    config = load_config(argv=argv)
    from service.server import serve

    return asyncio.run(serve(config))
