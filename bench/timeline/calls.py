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

from bench.served import stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb


def main() -> None:
    port, calls = sys.argv[1], int(sys.argv[2])
    wait_serving(f"127.0.0.1:{port}")
    client = stub(f"127.0.0.1:{port}")
    request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=list(range(3, 23)))),
                                 stopping=pb.StoppingOptions(max_new_tokens=2, ignore_eos=True))
    first, beyond, whole = [], [], []
    for _ in range(calls):
        sent, token_at, done = time.perf_counter(), None, None
        for event in client.GenerateStream(request):
            if event.HasField("token") and token_at is None:
                token_at = time.perf_counter()
            elif event.HasField("done"):
                done = event.done
        assert token_at is not None and done is not None
        first.append((token_at - sent) * 1e3)
        beyond.append(first[-1] - done.timing.ttft_ms)
        whole.append((time.perf_counter() - sent) * 1e3)
    kept = calls // 6  # the first sixth warms up
    print(f"client TTFT {statistics.median(first[kept:]):.3f} ms, beyond the server's TTFT "
          f"{statistics.median(beyond[kept:]):.3f} ms, whole call {statistics.median(whole[kept:]):.3f} ms")


if __name__ == "__main__":
    main()
