"""Back-to-back GenerateStream calls against a running server (20-token prompt, 2 new tokens): the
client's TTFT, how much of it lies beyond the server's own `timing.ttft_ms`, and the whole call.
With a tiny generated model the forwards cost ~0.2 ms, so what is left is the control plane's and
gRPC's own per-call cost; run a sampling profiler on the server meanwhile to see where it goes:

    python -m service --model DIR --provider cpu --port 50777 --metrics-port 0 --log-level warning &
    python -m bench.timeline.calls 50777 4000 &
    py-spy record -p SERVER_PID --threads --native -r 500 -f raw -o prof.txt -d 6
"""

from __future__ import annotations

import statistics
import sys
import time

from bench.prefix import stream
from bench.served import stub, wait_serving


def main() -> None:
    port, calls = sys.argv[1], int(sys.argv[2])
    wait_serving(f"127.0.0.1:{port}")
    client = stub(f"127.0.0.1:{port}")
    first, beyond, whole = [], [], []
    for _ in range(calls):
        sent = time.perf_counter()
        call = stream(client, list(range(3, 23)), 2)
        whole.append((time.perf_counter() - sent) * 1e3)
        first.append(call["ttft_ms"])
        beyond.append(call["ttft_ms"] - call["server_ttft_ms"])
    kept = calls // 6  # the first sixth warms up
    print(
        f"client TTFT {statistics.median(first[kept:]):.3f} ms, beyond the server's TTFT "
        f"{statistics.median(beyond[kept:]):.3f} ms, whole call {statistics.median(whole[kept:]):.3f} ms"
    )


if __name__ == "__main__":
    main()
