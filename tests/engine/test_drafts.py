"""Prompt-lookup drafts (engine/planner/drafts.py): pure values against a brute-force reading."""

from __future__ import annotations

import random

import pytest

from engine.planner.drafts import MAX_K, VERIFY_WIDTHS, Backoff, Lookup, verify_width


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


def test_a_row_whose_drafts_miss_waits_longer_each_time_and_a_kept_token_ends_the_wait() -> None:
    backoff = Backoff()
    waits = []
    for _ in range(7):
        assert backoff.drafts()
        backoff.verified(drafted=3, accepted=0)
        skipped = 0
        while not backoff.drafts():
            skipped += 1
        waits.append(skipped)
    assert waits == [1, 2, 4, 8, 16, 16, 16]  # doubling up to MAX_WAIT
    backoff.verified(drafted=3, accepted=1)
    assert backoff.drafts() and backoff.drafts()
    backoff.verified(drafted=0, accepted=0)  # no draft checked: nothing learnt
    assert backoff.drafts()
