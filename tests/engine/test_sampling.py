"""Sampling is judged on distributions, not single draws."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from engine.sampling import (
    Sampler,
    SamplingParams,
    apply_presence_frequency,
    apply_repetition_penalty,
    draw,
    filtered_probabilities,
    log_probs,
    nucleus,
    nucleus_mask,
    philox,
    philox_one,
    token_logprobs,
    uniform,
)
from tests.support.draws import COMBINATIONS, assert_drawn_from, named, row_logits

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))


def _histogram(params: SamplingParams, draws: int = 20000) -> np.ndarray:
    sampler = Sampler(params)  # draw i is the one for position i of a sequence
    counts = np.bincount([sampler(LOGITS, range(i)) for i in range(draws)], minlength=LOGITS.size)
    return counts / draws


def test_greedy_always_picks_the_argmax() -> None:
    sampler = Sampler(SamplingParams(temperature=0.0, seed=1))
    assert {sampler(LOGITS) for _ in range(100)} == {0}


def test_temperature_one_reproduces_the_softmax_distribution() -> None:
    hist = _histogram(SamplingParams(temperature=1.0, seed=2))
    np.testing.assert_allclose(hist, [0.5, 0.2, 0.15, 0.1, 0.05], atol=0.015)


def test_low_temperature_sharpens_and_high_temperature_flattens() -> None:
    cold = _histogram(SamplingParams(temperature=0.5, seed=3))
    hot = _histogram(SamplingParams(temperature=2.0, seed=3))
    assert cold[0] > 0.6 > 0.5 > hot[0]
    assert hot[4] > 0.05 > cold[4]


def test_top_k_draws_only_from_the_k_most_likely() -> None:
    hist = _histogram(SamplingParams(temperature=1.0, top_k=2, seed=4))
    assert hist[2:].sum() == 0
    np.testing.assert_allclose(hist[:2], [0.5 / 0.7, 0.2 / 0.7], atol=0.015)


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    probs = filtered_probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs[3:] == 0).all()
    np.testing.assert_allclose(probs[:3], np.array([0.5, 0.2, 0.15]) / 0.85, rtol=1e-5)


def test_the_same_seed_gives_the_same_draws() -> None:
    a = Sampler(SamplingParams(temperature=1.0, seed=7))
    b = Sampler(SamplingParams(temperature=1.0, seed=7))
    assert [a(LOGITS, range(i)) for i in range(50)] == [b(LOGITS, range(i)) for i in range(50)]
    assert len({a(LOGITS, range(i)) for i in range(50)}) > 1


def test_a_draw_depends_only_on_the_key_and_the_position_not_on_earlier_draws() -> None:
    a = Sampler(SamplingParams(temperature=1.0, seed=7))
    forward = [a(LOGITS, range(i)) for i in range(40)]
    backward = [a(LOGITS, range(i)) for i in reversed(range(40))][::-1]
    assert forward == backward


def test_unseeded_samplers_draw_from_keys_of_their_own() -> None:
    one, two = Sampler(SamplingParams(temperature=1.0)), Sampler(SamplingParams(temperature=1.0))
    assert one.key != two.key
    assert [one(LOGITS, range(i)) for i in range(64)] != [two(LOGITS, range(i)) for i in range(64)]


def test_the_generator_is_numpy_s_philox_4x64_10() -> None:
    keys = np.array([0, 7, 2**63 + 5, 2**64 - 1], np.uint64)
    for position in (1, 2, 1000, 2**40 + 3):
        counters = np.full(keys.size, position, np.uint64)
        words, doubles = philox(keys, counters), uniform(keys, counters)
        for i, key in enumerate(keys):

            def made(key: np.uint64 = key, position: int = position) -> np.random.Philox:
                return np.random.Philox(
                    key=np.array([key, 0], np.uint64), counter=np.array([position - 1, 0, 0, 0], np.uint64)
                )

            assert int(words[i]) == int(made().random_raw()) == philox_one(int(key), position)
            assert doubles[i] == np.random.Generator(made()).random()


def test_repetition_penalty_lowers_seen_tokens_either_sign() -> None:
    logits = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repetition_penalty(logits, [0, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])
    assert Sampler(SamplingParams(repetition_penalty=10.0))(np.array([3.0, 1.0]), [0]) == 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=-1.0),
        SamplingParams(top_k=-1),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
        SamplingParams(repetition_penalty=0.0),
        SamplingParams(temperature=float("nan")),
    ],
)
def test_bad_sampling_values_are_refused(params: SamplingParams) -> None:
    with pytest.raises(ValueError):
        Sampler(params)


def test_min_p_keeps_only_tokens_at_least_that_fraction_of_the_most_likely() -> None:
    probs = filtered_probabilities(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))
    assert (probs[2:] == 0).all()  # 0.15 < 0.3 * 0.5
    np.testing.assert_allclose(probs[:2], [0.5 / 0.7, 0.2 / 0.7], rtol=1e-6)


def test_presence_and_frequency_penalties_subtract_as_the_openai_api_says() -> None:
    counts = Counter({0: 3, 2: 1})
    out = apply_presence_frequency(np.zeros(4, np.float32), counts, presence=0.5, frequency=0.25)
    np.testing.assert_allclose(out, [-(0.5 + 3 * 0.25), 0.0, -(0.5 + 0.25), 0.0])


def test_presence_penalty_counts_only_the_tokens_the_sampler_chose() -> None:
    sampler = Sampler(SamplingParams(presence_penalty=2.0))
    logits = np.array([1.0, 0.0], np.float32)
    assert sampler(logits, history=[0, 0]) == 0  # the prompt's tokens are not penalized
    sampler.chose(0)
    assert sampler(logits, history=[0, 0]) == 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(min_p=-0.1),
        SamplingParams(min_p=1.5),
        SamplingParams(presence_penalty=2.5),
        SamplingParams(frequency_penalty=-2.01),
        SamplingParams(frequency_penalty=float("nan")),
    ],
)
def test_values_outside_the_new_ranges_are_refused_naming_the_field(params: SamplingParams) -> None:
    with pytest.raises(ValueError, match=r"^(min_p|presence_penalty|frequency_penalty) must be"):
        params.validate()


def test_log_probs_are_a_log_softmax_of_the_raw_logits_and_top_n_are_the_largest() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32)
    tokens = np.array([4, 9, 49])
    chosen, ids, values = log_probs(np, logits, tokens, 5)
    reference = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(chosen, reference[np.arange(3), tokens], rtol=1e-5)
    for r, found in enumerate(token_logprobs(tokens.tolist(), chosen, ids, values)):
        assert [i for i, _ in found.top] == np.argsort(-reference[r])[:5].tolist()
        np.testing.assert_allclose([v for _, v in found.top], np.sort(reference[r])[::-1][:5], rtol=1e-5)


def test_each_sample_of_a_seeded_request_gets_the_next_seed() -> None:
    params = SamplingParams(temperature=1.0, seed=2**64 - 1)
    assert [params.for_sample(i).seed for i in range(3)] == [2**64 - 1, 0, 1]
    assert SamplingParams(temperature=1.0).for_sample(3).seed is None


def _full_sort_nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Top-p as it was first written: every token sorted (the reference `nucleus` must equal)."""
    order = np.argsort(-probs, kind="stable")
    return order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]


def _distributions() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = []
    for vocab in (50, 3000, 32000, 128256):
        for scale in (0.1, 1.0, 4.0, 12.0):  # flat (random weights) to peaked (a trained model)
            logits = rng.standard_normal(vocab) * scale
            probs = np.exp(logits - logits.max())
            out.append(probs / probs.sum())
        tied = np.repeat(rng.random(max(vocab // 40, 1)), 40)[:vocab]  # runs of equal probabilities
        tied[rng.integers(0, vocab, 5)] = 0.0
        out.append(tied / tied.sum())
    return out


@pytest.mark.parametrize("top_p", [1e-6, 0.05, 0.5, 0.9, 0.95, 0.999999, 1.0 - 1e-12])
def test_top_p_keeps_exactly_the_tokens_a_sort_of_every_token_keeps(top_p: float) -> None:
    for probs in _distributions():
        np.testing.assert_array_equal(nucleus(probs, top_p), _full_sort_nucleus(probs, top_p))
        np.testing.assert_array_equal(
            np.flatnonzero(nucleus_mask(probs, top_p)), np.sort(_full_sort_nucleus(probs, top_p))
        )


def test_top_p_filtering_gives_bit_for_bit_the_distribution_and_draws_a_full_sort_gave() -> None:
    rng = np.random.default_rng(3)
    for scale in (0.5, 3.0, 10.0):
        logits = (rng.standard_normal(32000) * scale).astype(np.float32)
        params = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
        before = filtered_probabilities(logits, replace(params, top_p=1.0))
        keep = _full_sort_nucleus(before, 0.9)
        mask = np.zeros_like(before)
        mask[keep] = before[keep]
        reference = mask / mask.sum()
        np.testing.assert_array_equal(filtered_probabilities(logits, params), reference)
        u = float(uniform(np.array([11], np.uint64), np.array([0], np.uint64))[0])
        assert Sampler(params)(logits) == _choice_at(u, reference)


def _filtered_as_first_written(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """filtered_probabilities before it worked in place (the reference it must equal bit for bit)."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.nan_to_num(
            logits.astype(np.float64) / params.temperature,
            nan=-np.inf,
            posinf=np.finfo(np.float64).max,
            neginf=-np.inf,
        )
    if 0 < params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    top = scaled.max()
    if top == -np.inf:
        out = np.zeros(scaled.size, np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    with np.errstate(over="ignore"):
        probs = np.exp(scaled - top)
    probs /= probs.sum()
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    if params.top_p < 1.0:
        keep = _full_sort_nucleus(probs, params.top_p)
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return probs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=40),
        SamplingParams(temperature=0.9, min_p=0.05),
        SamplingParams(temperature=0.6, top_p=0.92, top_k=500),
    ],
)
def test_the_filtered_distribution_is_bit_for_bit_what_it_was(params: SamplingParams) -> None:
    rng = np.random.default_rng(5)
    for dtype in (np.float16, np.float32, np.float64):
        for vocab in (7, 5000, 128256):
            logits = (rng.standard_normal(vocab) * 4).astype(dtype)
            odd = logits.copy()
            odd[rng.integers(0, vocab, 3)] = [np.nan, np.inf, -np.inf]
            for row in (logits, odd, np.full(vocab, -np.inf, dtype)):
                kept = row.copy()
                np.testing.assert_array_equal(
                    filtered_probabilities(row, params), _filtered_as_first_written(row, params)
                )
                np.testing.assert_array_equal(row, kept)  # the caller's row is left as it was


def _choice_at(u: float, probs: np.ndarray) -> int:
    """numpy's `choice` for the generator state whose next double is `u`, written out: the first
    index whose normalised running sum exceeds it."""
    cdf = np.cumsum(probs)
    cdf /= cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))


def test_a_draw_is_numpy_s_choice_token_for_token() -> None:
    for k, probs in enumerate(_distributions()):
        for top_p in (0.5, 0.95, 1.0):
            kept = np.zeros_like(probs)
            keep = nucleus(probs, top_p)
            kept[keep] = probs[keep]
            kept /= kept.sum()
            for seed in range(25):
                ours, numpy_s = np.random.default_rng((k, seed)), np.random.default_rng((k, seed))
                assert draw(ours.random(), kept) == int(numpy_s.choice(kept.size, p=kept))


def _host_draws(
    params: SamplingParams,
    logits: np.ndarray,
    draws: int,
    history: Sequence[int] = (),
    counts: Counter[int] | None = None,
) -> np.ndarray:
    """The host sampler's tokens at positions len(history), len(history) + 1, ...: their histogram."""
    sampler = Sampler(params)
    sampler.counts = counts or Counter()
    prefix = list(history)  # with a history: draw i's history is it and i + 1 zeros (token 0 always seen)
    tokens = [sampler(logits, prefix + [0] * (i + 1) if prefix else range(i)) for i in range(draws)]
    return np.bincount(tokens, minlength=logits.size)


@pytest.mark.parametrize("params", COMBINATIONS, ids=named)
def test_host_draws_follow_the_filtered_distribution_for_every_filter_combination(params) -> None:
    logits = row_logits(1)
    assert_drawn_from(_host_draws(params, logits, 6000), filtered_probabilities(logits, params))


@pytest.mark.parametrize(
    "penalties",
    [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=0.8),
        dict(frequency_penalty=0.5, presence_penalty=-0.4, repetition_penalty=0.8),
    ],
)
def test_host_draws_with_penalties_follow_the_penalized_distribution(penalties) -> None:
    params = replace(SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=3), **penalties)
    logits, history, counts = row_logits(2), [1, 2, 3, 5, 8, 13], Counter({1: 3, 8: 1, 21: 2})
    seen = apply_repetition_penalty(logits, [*history, 0], params.repetition_penalty)
    penalized = apply_presence_frequency(seen, counts, params.presence_penalty, params.frequency_penalty)
    assert_drawn_from(
        _host_draws(params, logits, 4000, history, counts), filtered_probabilities(penalized, params)
    )
