"""n samples through a server on a real device (run on the H200; CI deselects `gpu`): more samples
than KV slots start as slots free, the later ones on copies of the prompt's slot and their first
tokens chosen from its logits beside the others' (one row read more than once), and each is the
one-sample request with its seed, greedy and sampled."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.models import CUDA_SPEC, cuda_model
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = cuda_model(tmp_path_factory.mktemp("models"))
    config = server_config(model, provider="cuda", max_sessions=4, capacity=1024, speculate="off")
    with RunningServer(config) as server:
        yield server


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_samples_beyond_the_slots_on_cuda_are_each_the_single_request_with_its_seed(
    running: RunningServer, temperature: float
) -> None:
    tokens = np.random.default_rng(5).integers(3, CUDA_SPEC.vocab_size, 40).tolist()

    def request(n: int, seed: int) -> pb.GenerateRequest:
        r = greedy_request(tokens, 12)
        r.n, r.sampling.temperature, r.sampling.seed = n, temperature, seed
        r.logprobs.top = 2  # the first tokens' log-probabilities too, read from one row for several
        return r

    reply = running.stub.Generate(request(10, 7), timeout=120)
    alone = [running.stub.Generate(request(1, 7 + i), timeout=60) for i in range(10)]
    assert [list(s.token_ids) for s in reply.samples] == [list(a.token_ids) for a in alone]
    firsts = [s.logprobs[0].logprob for s in reply.samples]
    assert firsts == pytest.approx([a.logprobs[0].logprob for a in alone], abs=1e-3)
    assert running.stats().sessions_open == 0
