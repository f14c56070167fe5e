"""Neither overlay can take its last ready pod away.

Read from the rendered manifests: the autoscaler's floor and ceiling, the rollout
strategy and the disruption budget. For every replica count the autoscaler may
choose, a rolling update and a voluntary eviction (a node drain) each leave at least
one ready pod, and each can still make progress. The two never stack: the budget
counts pods the rollout has taken down, and refuses evictions while any are down.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from deploy_support import OVERLAYS, one, overlay

Objects = list[dict[str, Any]]


def scaled(value: int | str, replicas: int, *, round_up: bool) -> int:
    """A Kubernetes int-or-percent field resolved against `replicas`, as the controllers do."""
    if isinstance(value, int):
        return value
    exact = replicas * int(value.rstrip("%")) / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def replica_counts(objects: Objects) -> range:
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    return range(hpa.get("minReplicas", 1), hpa["maxReplicas"] + 1)


def rollout_limits(objects: Objects, replicas: int) -> tuple[int, int]:
    """(surge, unavailable) of a rolling update at `replicas` (maxSurge rounds up, maxUnavailable down)."""
    update = one(objects, "Deployment")["spec"]["strategy"].get("rollingUpdate", {})
    return (
        scaled(update.get("maxSurge", "25%"), replicas, round_up=True),
        scaled(update.get("maxUnavailable", "25%"), replicas, round_up=False),
    )


def evictions_allowed(objects: Objects, replicas: int) -> int:
    """Pods a node drain may evict at once from `replicas` healthy ones (the budget rounds up)."""
    budget = one(objects, "PodDisruptionBudget")["spec"]
    if "minAvailable" in budget:
        return replicas - scaled(budget["minAvailable"], replicas, round_up=True)
    return scaled(budget["maxUnavailable"], replicas, round_up=True)


def fewest_ready(objects: Objects) -> int:
    """The fewest ready pods any rollout step or eviction leaves, over every allowed replica count."""
    return min(
        replicas - max(rollout_limits(objects, replicas)[1], evictions_allowed(objects, replicas))
        for replicas in replica_counts(objects)
    )


@pytest.mark.parametrize("name", OVERLAYS)
def test_no_rollout_or_eviction_leaves_zero_ready_pods(name: str) -> None:
    assert fewest_ready(overlay(name)) >= 1


@pytest.mark.parametrize("name", OVERLAYS)
def test_a_rollout_and_a_node_drain_can_always_proceed(name: str) -> None:
    objects = overlay(name)
    for replicas in replica_counts(objects):
        assert sum(rollout_limits(objects, replicas)) >= 1, f"a rollout at {replicas} replicas cannot move"
        assert evictions_allowed(objects, replicas) >= 1, f"a drain at {replicas} replicas is blocked"


def test_the_gpu_overlay_as_first_shipped_would_have_reached_zero_ready_pods() -> None:
    # minReplicas 1 with maxSurge 0 / maxUnavailable 1 and a budget of one: the arithmetic must catch it.
    objects = copy.deepcopy(overlay("gpu"))
    one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"] = 1
    assert fewest_ready(objects) == 0


def test_percentages_resolve_as_the_controllers_round_them() -> None:
    assert scaled("25%", 3, round_up=True) == 1 and scaled("25%", 3, round_up=False) == 0
    assert scaled(2, 10, round_up=False) == 2
