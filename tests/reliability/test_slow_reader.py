"""A client that reads its stream slowly holds back nobody: its tokens wait for it, the worker does not."""

from __future__ import annotations

from pathlib import Path

from tests.service.conftest import (
    RunningServer,
    greedy_request,
    model_with_tokenizer,
    prompt_ids,
    server_config,
)


def test_a_slow_reader_keeps_decoding_in_step_with_others_and_gets_every_token_in_order(
        tmp_path: Path) -> None:
    running = RunningServer(server_config(model_with_tokenizer(tmp_path), max_new_tokens=1000))
    try:
        scheduler = running.server.serving.scheduler  # type: ignore[union-attr]
        slow = running.stub.GenerateStream(greedy_request(prompt_ids(30, seed=1), 300))
        first = next(slow)  # then it reads nothing while the other stream runs
        fast = running.stub.GenerateStream(greedy_request(prompt_ids(20, seed=2), 200))
        fast_tokens = [e.token.id for e in fast if e.HasField("token")]
        steps = list(scheduler.steps)
        slow_tokens = [first.token.id] + [e.token.id for e in slow if e.HasField("token")]
        alone = running.stub.Generate(greedy_request(prompt_ids(30, seed=1), 300))
    finally:
        running.close()
    assert len(fast_tokens) == 200 and slow_tokens == list(alone.token_ids)
    together = [r for r in steps if len(r.decode) == 2]
    # While the fast stream ran, the unread stream went on decoding in the same forwards.
    assert len(together) >= 150
