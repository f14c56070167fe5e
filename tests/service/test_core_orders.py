"""The core's orders and events (service/core/orders.py, service/events.py) as values a process boundary
carries: frozen, and equal to themselves after a pickle round trip, every kind of each. The
transport of issue #42's process cut sends them as they are; today Core answers them in process,
which the rest of the suite exercises end to end."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from engine.sampling import SamplingParams, TokenLogprobs
from service.calls import ConstraintSpec, LogprobRequest, Stopping
from service.core import orders as core
from service.events import (
    Finish,
    Finished,
    ForwardDone,
    PrefillFinished,
    PromptLogprobs,
    Shared,
    Started,
    TokenOut,
)

SAMPLING = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
STOPPING = Stopping(32, stop=("\n\n",), stop_token_ids=frozenset({2}), min_new_tokens=3)
LOGPROBS = TokenLogprobs(11, -0.25, ((11, -0.25), (12, -1.5)))

ORDERS = [
    core.GenerateOrder(
        (1, 2, 3),
        SAMPLING,
        STOPPING,
        n=4,
        logprobs=LogprobRequest(top=2, prompt=True),
        constraint=ConstraintSpec("json_schema", '{"type": "object"}'),
        speculate=False,
        caller="team-a",
        request_id="r1",
        watching=True,
        unary=True,
    ),
    core.DecodeOrder(
        "pod-a.s1", SAMPLING, STOPPING, LogprobRequest(top=1), caller="team-a", request_id="r1", watching=True
    ),
    core.PrefillOrder("", SAMPLING, "team-a"),
    core.RewindOrder("pod-a.s1", 12, "team-a"),
    core.CloseOrder("pod-a.s1", "team-a"),
    core.ForkOrder("pod-a.s1", 8, "fork-1", "team-a"),
]
EVENTS = [
    Started(1.5),
    ForwardDone(171, 171, 0, 171),
    Shared(64),
    TokenOut(11, "", 0, 2.5, LOGPROBS, 3),
    PromptLogprobs((LOGPROBS,)),
    Finished(Finish.STOP, "", 40, 3),
    PrefillFinished(40, 11),
    core.ForkDone("pod-a.s2", 8, "pod-a.s1", 0.4, retry=True),
]


@pytest.mark.parametrize("value", [*ORDERS, *EVENTS], ids=lambda v: type(v).__name__)
def test_every_order_and_event_is_frozen_and_pickles_to_itself(value: object) -> None:
    assert dataclasses.is_dataclass(value)
    assert type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(value)) == value


def test_every_order_the_core_takes_is_listed_here() -> None:
    orders = {name for name in dir(core) if name.endswith("Order")}
    assert orders == {type(o).__name__ for o in ORDERS}
    assert isinstance(core.VERSION, int)
