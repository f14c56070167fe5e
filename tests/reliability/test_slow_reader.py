"""A client that reads its stream slowly holds back nobody: its tokens wait for it, the worker does not."""

from __future__ import annotations

from pathlib import Path

from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for


def test_a_slow_reader_keeps_decoding_in_step_with_others_and_gets_every_token_in_order(
    served_model: Path,
) -> None:
    with RunningServer(server_config(served_model, max_new_tokens=1000)) as running:
        # Both calls reach the held worker before either runs, so they start decoding together
        # however slowly this machine sends the second (the slow one would otherwise finish alone).
        with running.frozen() as scheduler:
            depth = scheduler.depth
            slow = running.stub.GenerateStream(greedy_request(prompt_ids(30, seed=1), 300))
            fast = running.stub.GenerateStream(greedy_request(prompt_ids(20, seed=2), 200))
            wait_for(lambda: scheduler.depth >= depth + 2)
        first = next(slow)  # then it reads nothing while the other stream runs
        fast_tokens = [e.token.id for e in fast if e.HasField("token")]
        steps = running.steps()
        slow_tokens = [first.token.id] + [e.token.id for e in slow if e.HasField("token")]
        alone = running.stub.Generate(greedy_request(prompt_ids(30, seed=1), 300))
    assert len(fast_tokens) == 200 and slow_tokens == list(alone.token_ids)
    together = [r for r in steps if len(r.decode) == 2]
    # While the fast stream ran, the unread stream went on decoding in the same forwards.
    assert len(together) >= 150
