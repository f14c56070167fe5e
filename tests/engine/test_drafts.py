"""Prompt-lookup drafts (engine/planner/drafts.py): pure values against a brute-force reading."""

from __future__ import annotations

import random

import pytest

from engine.planner.drafts import (
    MAX_K,
    MAX_WAIT,
    SMOOTHING,
    VERIFY_WIDTHS,
    Acceptance,
    Costs,
    Lookup,
    verify_width,
)


def reference(tokens: list[int], k: int, max_n: int, min_n: int) -> tuple[int, ...]:
    """The longest suffix (max_n..min_n) with an earlier occurrence ending before the last token:
    the k tokens after its latest such occurrence."""
    length = len(tokens)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tuple(tokens[end : end + k])
    return ()


def test_a_draft_follows_the_latest_earlier_occurrence_of_the_longest_suffix() -> None:
    rng = random.Random(7)
    for _ in range(300):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(0, 60))]
        k, max_n = rng.randrange(1, MAX_K + 1), rng.randrange(1, 5)
        min_n = rng.randrange(1, max_n + 1)
        assert Lookup(k, max_n, min_n, tokens=list(tokens)).propose() == reference(tokens, k, max_n, min_n)


def test_extending_token_by_token_drafts_as_building_at_once() -> None:
    rng = random.Random(11)
    tokens = [rng.randrange(5) for _ in range(200)]
    grown = Lookup(k=4)
    for i, token in enumerate(tokens):
        grown.extend([token])
        assert grown.propose() == Lookup(k=4, tokens=tokens[: i + 1]).propose()


def test_a_suffix_seen_nowhere_before_drafts_nothing_and_a_repeat_drafts_what_followed() -> None:
    assert Lookup(tokens=[1, 2, 3]).propose() == ()
    assert Lookup(k=3, tokens=[5, 6, 7, 8, 9, 5, 6]).propose() == (7, 8, 9)
    # The longest suffix wins over a later, shorter one: [6, 7] after [5, 6, 7] -> what followed [5, 6, 7].
    assert Lookup(k=2, tokens=[5, 6, 7, 1, 2, 9, 6, 7, 3, 5, 6, 7]).propose() == (1, 2)


@pytest.mark.parametrize(("k", "max_n", "min_n"), [(0, 3, 1), (MAX_K + 1, 3, 1), (4, 1, 2), (4, 3, 0)])
def test_draft_bounds_outside_the_documented_ranges_are_refused(k: int, max_n: int, min_n: int) -> None:
    with pytest.raises(ValueError):
        Lookup(k, max_n, min_n)


def test_every_verification_width_is_on_the_verification_ladder() -> None:
    for rows in range(1, MAX_K + 2):
        width = verify_width(rows)
        assert width in VERIFY_WIDTHS and width >= rows
        assert all(w < rows for w in VERIFY_WIDTHS if w < width)  # the narrowest that holds them
    with pytest.raises(ValueError):
        verify_width(MAX_K + 2)


def test_a_verification_costs_a_guess_until_it_and_a_step_are_measured() -> None:
    costs = Costs()
    assert costs.ratio(5) == 1.5
    costs.saw_step(0.010)
    costs.saw_verify(5, 0.030)
    assert costs.ratio(5) == pytest.approx(3.0) and costs.ratio(3) == 1.25
    costs.saw_verify(5, 0.010)  # a running average: the newest counts for SMOOTHING of it
    assert costs.ratio(5) == pytest.approx(3.0 - SMOOTHING * 2.0)


def test_a_draft_is_verified_as_far_as_it_pays_for_its_rows() -> None:
    cheap, dear = Costs(), Costs(step=0.010)
    for width in VERIFY_WIDTHS:
        cheap.saw_verify(width, 0.010)  # memory-bound: extra rows are free
        dear.saw_verify(width, 0.010 * width)  # every row costs a step
    likely = Acceptance(kept=9, checked=10)
    assert likely.length(8, cheap) == 8 and likely.length(3, cheap) == 3
    assert Acceptance(kept=9, checked=10).length(8, dear) == 1  # a probe: nothing beats a plain step
    assert Acceptance().length(0, cheap) == 0


def test_a_row_whose_drafts_never_pay_probes_one_token_ever_more_rarely() -> None:
    dear = Costs(step=0.010, verify={w: 0.010 * w for w in VERIFY_WIDTHS})
    acceptance, probes = Acceptance(kept=0.0, checked=10.0), []
    for step in range(80):
        if acceptance.length(4, dear):
            probes.append(step)
            acceptance.verified(drafted=1, accepted=0)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps[:5] == [2, 3, 5, 9, 17] and set(gaps[5:]) == {MAX_WAIT + 1}


def test_kept_tokens_raise_the_estimate_and_refused_ones_lower_it() -> None:
    acceptance = Acceptance()
    before = acceptance.rate
    acceptance.verified(drafted=4, accepted=4)
    assert acceptance.rate > before
    high = acceptance.rate
    acceptance.verified(drafted=4, accepted=0)
    assert acceptance.rate < high
    acceptance.verified(drafted=0, accepted=0)  # nothing checked: nothing learnt
    assert acceptance.rate < high
