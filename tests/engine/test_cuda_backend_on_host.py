"""The CUDA backend's bookkeeping, run on the host: numpy buffers, CPU provider, no graphs.

The staging row prefill variants bind, the pool rows decode variants bind,
eager fallbacks and choosing on the backend are the same code on both; only
the array module and the provider differ.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.executor import DecodeRow, EngineOptions, Session
from engine.executor.engine import Engine, make_backend
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic
from engine.runtime.cpu import CpuBackend
from engine.runtime.cuda import host_runtime
from engine.sampling import Sampler, SamplingParams, TokenLogprobs
from tests.support.engines import host_device_engine
from tests.support.prompts import prompt_ids

GREEDY = Sampler(SamplingParams())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_synthetic(TINY, tmp_path_factory.mktemp("models"))


device_engine = host_device_engine


def cpu_engine(path: Path, **overrides: object) -> Engine:
    options = EngineOptions(capacity=512, **overrides)  # type: ignore[arg-type]
    info = load_model_info(path)
    return Engine(info, options, CpuBackend(info, options))


def generate(engine: Engine, tokens: list[int], new: int, sampler: Sampler = GREEDY) -> list[int]:
    session = engine.open_session()
    engine.append(session, tokens)
    out = [engine.choose(session, sampler)]
    while len(out) < new:
        out.append(engine.decode([DecodeRow(session, out[-1], sampler)])[0])  # type: ignore[arg-type]
    engine.close_session(session)
    return out


def test_the_device_backend_matches_the_cpu_backend_token_for_token(model_dir: Path) -> None:
    for n in (1, 5, 70, 150):
        assert generate(device_engine(model_dir), prompt_ids(n, n), 12) == generate(
            cpu_engine(model_dir), prompt_ids(n, n), 12
        )


def test_sessions_prefilled_in_turns_through_the_staging_row_decode_together_exactly(model_dir: Path) -> None:
    lengths = (90, 33, 140)
    alone = [generate(cpu_engine(model_dir), prompt_ids(n, n), 10) for n in lengths]
    engine = device_engine(model_dir)
    sessions = [engine.open_session() for _ in lengths]
    for half in (0, 1):  # every session's prompt in two parts, the parts interleaved
        for s, n in zip(sessions, lengths, strict=True):
            part = prompt_ids(n, n)[: n // 2] if half == 0 else prompt_ids(n, n)[n // 2 :]
            engine.append(s, part)
    outs = [[engine.choose(s, GREEDY)] for s in sessions]
    for _ in range(9):
        chosen = engine.decode([DecodeRow(s, o[-1], GREEDY) for s, o in zip(sessions, outs, strict=True)])
        for out, token in zip(outs, chosen, strict=True):
            out.append(token)  # type: ignore[arg-type]
    assert outs == alone
    assert engine.backend.memory()["staging_copied_positions"] > 0


def test_a_session_rewound_after_others_used_the_staging_row_resumes_exactly(model_dir: Path) -> None:
    engine = device_engine(model_dir)
    a, b = engine.open_session(), engine.open_session()
    engine.append(a, prompt_ids(80))
    first = engine.choose(a, GREEDY)
    engine.append(b, prompt_ids(40, 1))  # b holds the staging row now
    engine.decode([DecodeRow(a, first, GREEDY), DecodeRow(b, 7, GREEDY)])
    engine.rewind(a, 80)
    engine.append(b, prompt_ids(30, 2))
    engine.append(a, [first])
    assert engine.choose(a, GREEDY) == generate(cpu_engine(model_dir), prompt_ids(80), 2)[1]


def test_widths_the_cache_will_not_keep_run_eagerly_with_the_same_tokens(model_dir: Path) -> None:
    engine = device_engine(model_dir, padding=False)
    outs = [generate(engine, prompt_ids(n, n), 3) for n in (20, 30, 45, 50, 55, 60, 61, 62)]
    stats = engine.stats()
    assert stats.variants.refusals > 0 and stats.eager_forwards == stats.variants.refusals
    assert outs == [
        generate(cpu_engine(model_dir, padding=False), prompt_ids(n, n), 3)
        for n in (20, 30, 45, 50, 55, 60, 61, 62)
    ]


def test_repetition_penalty_and_seeded_sampling_on_the_backend_match_the_host(model_dir: Path) -> None:
    for params in (SamplingParams(repetition_penalty=1.8), SamplingParams(temperature=0.9, seed=3)):
        device = generate(device_engine(model_dir), prompt_ids(60), 8, Sampler(params))
        assert device == generate(cpu_engine(model_dir), prompt_ids(60), 8, Sampler(params))


def test_presence_and_frequency_penalties_and_min_p_on_the_backend_match_the_host(model_dir: Path) -> None:
    for params in (
        SamplingParams(presence_penalty=2.0),
        SamplingParams(frequency_penalty=1.5),
        SamplingParams(temperature=1.2, min_p=0.2, presence_penalty=-1.0, seed=5),
    ):
        device = generate(device_engine(model_dir), prompt_ids(40), 10, Sampler(params))
        assert device == generate(cpu_engine(model_dir), prompt_ids(40), 10, Sampler(params))


def test_log_probabilities_on_the_backend_match_the_host(model_dir: Path) -> None:
    found = []
    for engine in (device_engine(model_dir), cpu_engine(model_dir)):
        sampler = Sampler(SamplingParams(), top_logprobs=5)
        session = engine.open_session()
        engine.append(session, prompt_ids(30))
        engine.choose(session, sampler)
        assert sampler.last is not None
        found.append(sampler.last)
    device, host = found
    assert device.token == host.token and [i for i, _ in device.top] == [i for i, _ in host.top]
    np.testing.assert_allclose(
        [device.logprob, *(v for _, v in device.top)], [host.logprob, *(v for _, v in host.top)], rtol=1e-6
    )


def test_prompt_log_probabilities_on_the_backend_match_the_host(model_dir: Path) -> None:
    found = []
    for engine in (device_engine(model_dir), cpu_engine(model_dir)):
        session = engine.open_session()
        task = engine.start_prefill(session, prompt_ids(150), logprob_top=4)
        while not task.done:
            engine.prefill_step(task)
        found.append(task.logprobs)
    device, host = found
    assert len(device) == len(host) == 149

    def ranked(found: list[TokenLogprobs]) -> list[tuple[int, list[int]]]:
        return [(p.token, [i for i, _ in p.top]) for p in found]

    assert ranked(device) == ranked(host)
    np.testing.assert_allclose([p.logprob for p in device], [p.logprob for p in host], rtol=1e-6)


def test_cuda_falls_back_to_cpu_when_the_provider_is_missing(model_dir: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA provider is installed here")
    backend = make_backend(load_model_info(model_dir), EngineOptions(provider="cuda"))
    assert backend.name == "cpu"


def scenario(engine: Engine) -> list[list[int]]:
    """Three sessions decode together; one leaves, one joins, one is rewound and extended between steps."""
    sessions = [engine.open_session() for _ in range(3)]
    for s, n in zip(sessions, (40, 90, 17), strict=True):
        engine.append(s, prompt_ids(n, n))
    outs = [[engine.choose(s, GREEDY)] for s in sessions]

    def step(active: list[int]) -> None:
        chosen = engine.decode([DecodeRow(sessions[i], outs[i][-1], GREEDY) for i in active])
        for i, token in zip(active, chosen, strict=True):
            outs[i].append(token)  # type: ignore[arg-type]

    for _ in range(6):
        step([0, 1, 2])
    engine.close_session(sessions[2])  # leaves: the launched step is dropped
    for _ in range(4):
        step([0, 1])
    sessions.append(engine.open_session())  # joins, in the freed row
    engine.append(sessions[3], prompt_ids(25, 3))
    outs.append([engine.choose(sessions[3], GREEDY)])
    for _ in range(4):
        step([0, 1, 3])
    engine.rewind(sessions[1], 95)  # between steps: a rewind and a prefill on a row in the batch
    engine.append(sessions[1], prompt_ids(5, 9))
    outs[1].append(engine.choose(sessions[1], GREEDY))
    for _ in range(5):
        step([0, 1, 3])
    return outs


def test_lookahead_gives_the_tokens_of_step_by_step_decode_and_hits_a_stable_batch(model_dir: Path) -> None:
    device = device_engine(model_dir)
    assert scenario(device) == scenario(cpu_engine(model_dir))
    decode = device.stats().decode
    assert decode.lookahead_hits >= 10 and decode.lookahead_misses >= 3


@pytest.mark.parametrize(
    "replay_thread", [False, True], ids=["forwards on the worker", "forwards on a runner"]
)
def test_a_stable_greedy_batch_chains_its_forwards_and_keeps_the_tokens(
    model_dir: Path, replay_thread: bool
) -> None:
    device = device_engine(model_dir, replay_thread=replay_thread)
    assert scenario(device) == scenario(cpu_engine(model_dir))
    decode = device.stats().decode
    assert 8 <= decode.chained <= decode.lookahead_hits  # rows leaving, joining, rewinding break a chain
    device.decoder.settle()
    device.check_invariants()  # every open row's mask says its session's length again


@pytest.mark.parametrize(
    "params, top", [(SamplingParams(), 2), (SamplingParams(repetition_penalty=1.3), None)]
)
def test_a_row_choosing_with_logprobs_or_a_penalty_is_never_chained(
    model_dir: Path, params: SamplingParams, top: int | None
) -> None:
    device = device_engine(model_dir)
    tokens = generate(device, prompt_ids(30, 4), 10, Sampler(params, top_logprobs=top))
    assert tokens == generate(cpu_engine(model_dir), prompt_ids(30, 4), 10, Sampler(params, top_logprobs=top))
    decode = device.stats().decode
    assert decode.lookahead_hits >= 5 and decode.chained == 0


def test_with_lookahead_off_nothing_is_launched_ahead(model_dir: Path) -> None:
    device = device_engine(model_dir, lookahead=False)
    assert scenario(device) == scenario(cpu_engine(model_dir))
    assert device.stats().decode.lookahead_hits == device.stats().decode.lookahead_misses == 0


def test_a_step_whose_token_is_a_requests_last_launches_nothing_ahead(model_dir: Path) -> None:
    def request(engine: Engine, last_marked: bool) -> tuple[list[int], int]:
        session = engine.open_session()
        engine.append(session, prompt_ids(30, 4))
        tokens = [engine.choose(session, GREEDY)]
        for step in range(4):  # the fourth step chooses the request's last token
            more = step < 3 or not last_marked
            tokens.append(engine.decode([DecodeRow(session, tokens[-1], GREEDY, more)])[0])  # type: ignore[arg-type]
        engine.close_session(session)
        decode = engine.stats().decode
        return tokens, decode.lookahead_launched - decode.lookahead_hits  # launched, never taken

    marked, unmarked = request(device_engine(model_dir), True), request(device_engine(model_dir), False)
    assert marked[1] == 0 and unmarked[1] == 1  # unmarked: a forward launched on the last token, wasted
    assert marked[0] == unmarked[0] == request(cpu_engine(model_dir), True)[0]


def test_rows_with_a_hole_decoded_in_any_order_match_the_cpu_backend(model_dir: Path) -> None:
    def run(engine: Engine) -> list[list[int]]:
        sessions = [engine.open_session() for _ in range(3)]
        for s, n in zip(sessions, (12, 50, 31), strict=True):
            engine.append(s, prompt_ids(n, n))
        engine.close_session(sessions[1])  # rows 0 and 2 decode, row 1 rides along empty
        kept = [sessions[2], sessions[0]]  # not in row order
        outs = [[engine.choose(s, GREEDY)] for s in kept]
        for _ in range(8):
            chosen = engine.decode([DecodeRow(s, o[-1], GREEDY) for s, o in zip(kept, outs, strict=True)])
            for out, token in zip(outs, chosen, strict=True):
                out.append(token)  # type: ignore[arg-type]
        return outs

    assert run(device_engine(model_dir)) == run(cpu_engine(model_dir))


def test_a_compact_batch_in_any_order_keeps_its_logits_without_an_index(model_dir: Path) -> None:
    engine = device_engine(model_dir)
    sessions = [engine.open_session() for _ in range(3)]
    for s, n in zip(sessions, (12, 50, 31), strict=True):
        engine.append(s, prompt_ids(n, n))
    kept = sessions[::-1]  # the step's order is not the rows' order
    outs = [[engine.choose(s, GREEDY)] for s in kept]
    for _ in range(6):
        chosen = engine.decode([DecodeRow(s, o[-1], GREEDY) for s, o in zip(kept, outs, strict=True)])
        for out, token in zip(outs, chosen, strict=True):
            out.append(token)  # type: ignore[arg-type]
    assert engine.backend.indexes == {}  # type: ignore[attr-defined]


def test_rows_with_a_hole_keep_their_logits_and_upload_their_index_once(model_dir: Path) -> None:
    backend = device_engine(model_dir).backend
    rows, vocab = backend.store.shape  # type: ignore[attr-defined]
    before = backend.store.copy()  # type: ignore[attr-defined]
    for step in range(3):
        logits = np.random.default_rng(step).standard_normal((rows, 1, vocab)).astype(before.dtype)
        backend.keep_batch([2, 0], logits)  # type: ignore[attr-defined]
        kept = backend.store  # type: ignore[attr-defined]
        assert (kept[[0, 2]] == logits[[0, 2], 0]).all() and (kept[1] == before[1]).all()
    assert list(backend.indexes) == [(0, 2)]  # type: ignore[attr-defined]


def test_a_session_prefilled_while_a_lookahead_is_in_flight_keeps_its_kv(model_dir: Path) -> None:
    """A launched step holds the other rows' lengths from before: a prefill in between is not undone."""

    def run(engine: Engine) -> list[list[int]]:
        running = [engine.open_session() for _ in range(3)]  # rows 0-2 in a batch of 4: row 3 rides along
        for s, n in zip(running, (20, 33, 27), strict=True):
            engine.append(s, prompt_ids(n, n))
        outs = [[engine.choose(s, GREEDY)] for s in running]

        def step(sessions: list[Session], tokens: list[list[int]]) -> None:
            rows = [DecodeRow(s, o[-1], GREEDY) for s, o in zip(sessions, tokens, strict=True)]
            chosen = engine.decode(rows)
            for out, token in zip(tokens, chosen, strict=True):
                out.append(token)  # type: ignore[arg-type]

        for _ in range(3):
            step(running, outs)  # the row set is stable: a step is launched ahead
        joining = engine.open_session()  # row 3: rode along in that launched step
        assert joining.row == 3
        engine.append(joining, prompt_ids(40, 40))
        outs.append([engine.choose(joining, GREEDY)])
        step(running, outs[:3])  # the launched step is taken, and the next one launched
        for _ in range(6):
            step([*running, joining], outs)
        return outs

    assert run(device_engine(model_dir)) == run(cpu_engine(model_dir))
    assert run(device_engine(model_dir, replay_thread=True)) == run(cpu_engine(model_dir))


def test_a_forward_launched_on_the_runner_has_run_before_anything_reads_or_reuses_it(model_dir: Path) -> None:
    """With `replay_thread`, a step launched ahead runs on the runner while the worker goes on; the
    next step, a prefill, a close and stats each find it run (and the runner's thread is the one
    every forward launched ahead ran on)."""
    device = device_engine(model_dir, replay_thread=True)
    threads = set()
    run = device.backend.session.run_with_iobinding  # type: ignore[attr-defined]

    def recorded(*args: object) -> None:
        threads.add(threading.current_thread().name)
        run(*args)

    device.backend.session.run_with_iobinding = recorded  # type: ignore[attr-defined]
    assert scenario(device) == scenario(cpu_engine(model_dir))
    assert any(name.startswith("ladder-forwards") for name in threads)
    device.decoder.settle()
    assert not device.backend.forwards.pending  # type: ignore[attr-defined]
    device.check_invariants()


def test_a_kv_copy_in_wide_words_moves_exactly_the_positions_asked_and_nothing_else() -> None:
    from engine.runtime.pool import KvPool

    for head_size in (8, 3):  # 16 bytes a position: copied as complex128 words; 6 bytes: as they are
        pool = KvPool(np, layers=3, rows=4, kv_heads=2, capacity=16, head_size=head_size, dtype=np.float16)
        pool.block[...] = np.random.default_rng(0).standard_normal(pool.block.shape)
        pool.block[0, 0, 2, 0, 0, 0] = np.float16(np.nan)  # any bits travel unchanged
        for src, dst, length in ((2, 0, 11), (0, 3, 16), (1, 2, 1), (3, 3, 5), (1, 0, 0)):
            expected = pool.block.copy()
            expected[:, :, dst, :, :length] = expected[:, :, src, :, :length]
            host_runtime().copy_positions(pool.block, dst, pool.block, src, 0, length)
            assert pool.block.tobytes() == expected.tobytes()
        staging = np.zeros((*pool.block.shape[:2], 1, *pool.block.shape[3:]), np.float16)
        for row, start, stop in ((2, 0, 7), (3, 5, 16), (0, 4, 4)):  # the staging block, both ways
            expected = pool.block.copy()
            host_runtime().copy_positions(staging, 0, pool.block, row, start, stop)
            assert staging[:, :, 0, :, start:stop].tobytes() == expected[:, :, row, :, start:stop].tobytes()
            host_runtime().copy_positions(pool.block, 1, staging, 0, start, stop)
            expected[:, :, 1, :, start:stop] = staging[:, :, 0, :, start:stop]
            assert pool.block.tobytes() == expected.tobytes()


def constrained(engine: Engine, regex: str, params: SamplingParams, top: int | None = None) -> Sampler:
    """A sampler held to `regex` over a byte vocabulary of the engine's width (token i: byte i % 256)."""
    from engine.constrain.compiled import compile_constraint
    from engine.constrain.vocabulary import Vocabulary

    size = engine.facts.vocab_size
    vocabulary = Vocabulary([bytes([i % 256]) for i in range(size)], size, engine.facts.eos_ids)
    return Sampler(params, top, compile_constraint("regex", regex, vocabulary).start())


def test_constrained_rows_choose_on_the_backend_as_on_the_host_greedy_penalized_and_sampled(
    model_dir: Path,
) -> None:
    regex = "[a-f]{3}(x|yz)[0-9]{4}"
    for params in (
        SamplingParams(),
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(temperature=1.0, seed=4),
    ):
        outs = []
        for engine in (device_engine(model_dir, max_sessions=3), cpu_engine(model_dir, max_sessions=3)):
            samplers = [constrained(engine, regex, params, top=3), GREEDY, constrained(engine, regex, params)]
            sessions = [engine.open_session() for _ in samplers]
            for i, session in enumerate(sessions):
                engine.append(session, prompt_ids(20 + i, i))
            out = [[engine.choose(s, m)] for s, m in zip(sessions, samplers, strict=True)]
            for _ in range(10):  # the longest match is 9 tokens: its end-of-sequence comes within 11
                rows = [DecodeRow(s, o[-1], m) for s, o, m in zip(sessions, out, samplers, strict=True)]
                for o, token in zip(out, engine.decode(rows), strict=True):
                    o.append(token)  # type: ignore[arg-type]
            outs.append(out)
            eos = set(engine.facts.eos_ids)
            for o in (out[0], out[2]):
                text = bytes(t % 256 for t in o[: next(i for i, t in enumerate(o) if t in eos)]).decode()
                assert re.fullmatch(regex, text), text
            last = samplers[0].last  # of the constrained distribution: what it does not allow is -inf
            assert last is not None and all(
                i in eos or chr(i % 256) in "abcdefxyz0123456789"
                for i, logprob in last.top
                if logprob > -np.inf
            )
        assert outs[0] == outs[1]
