"""Deterministic prompts and the greedy request: the same seed gives the same ids in every test."""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.python import Stopping
from proto.ladder.v1 import ladder_pb2 as pb

# 100 ids for the client tests: two chunk forwards at chunk width 64.
PROMPT_IDS = [(7 * i + 3) % 500 + 3 for i in range(100)]


def prompt_ids(length: int, seed: int = 0, vocab: int = 512) -> list[int]:
    """`length` ids drawn from [3, vocab): no id below 3, so no prompt holds a special token."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, length)]


def common_prefix(*prompts: list[int]) -> int:
    """How many leading ids every one of `prompts` has in common."""
    length = 0
    for column in zip(*prompts, strict=False):
        if len(set(column)) > 1:
            break
        length += 1
    return length


def greedy_request(tokens: list[int], n: int, **stopping: Any) -> pb.GenerateRequest:
    """A GenerateRequest for exactly `n` greedy tokens (EOS ignored)."""
    return pb.GenerateRequest(
        prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)),
        stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True, **stopping),
    )


def greedy_stopping(n: int) -> Stopping:
    """The client library's stopping options for exactly `n` tokens (EOS ignored)."""
    return Stopping(max_new_tokens=n, ignore_eos=True)
