"""The planner's promises, stated as invariants over pure values."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from engine.planner import (
    CapacityExceeded,
    Limits,
    PaddingPolicy,
    PortShape,
    chunk_spans,
    chunk_width,
    ladder_widths,
    plan_prefill,
    prefill_query_width,
    step_for,
)
from engine.planner.padding import PaddingRefusal

ROOMY = Limits(capacity=1 << 20)


def test_every_prefill_width_for_chunk_512_is_on_the_ladder() -> None:
    for rows in range(2, 513):
        assert prefill_query_width(rows, 512) in {171, 342, 512}


def test_a_width_covers_its_rows_and_wastes_less_than_one_step() -> None:
    for cap in (16, 64, 100, 512, 777, 2048):
        step = step_for(cap)
        for rows in range(2, cap + 1):
            width = prefill_query_width(rows, cap)
            assert rows <= width <= cap
            assert width - rows < step


def test_single_rows_rows_beyond_the_cap_and_a_zero_cap_run_exact() -> None:
    assert prefill_query_width(1, 512) == 1
    assert prefill_query_width(0, 512) == 0
    assert prefill_query_width(513, 512) == 513
    assert prefill_query_width(300, 0) == 300


def test_small_caps_keep_the_minimum_step_of_16() -> None:
    assert step_for(30) == 16
    assert prefill_query_width(3, 30) == 16
    assert prefill_query_width(17, 30) == 30
    assert ladder_widths(30) == (16, 30)


# Every cap up to 600, then a seeded sample of larger ones: the exhaustive sweep to 4096
# made 8.4 M calls (7 s) to check the same arithmetic.
CAPS = [*range(32, 601), *random.Random(13).sample(range(601, 4097), 150), 1024, 2048, 4096]


def test_every_cap_has_at_most_three_widths_and_the_cap_is_one_of_them() -> None:
    for cap in CAPS:
        widths = {prefill_query_width(rows, cap) for rows in range(2, cap + 1)}
        assert len(widths) <= 3
        assert cap in widths
        assert widths == set(ladder_widths(cap))


def test_the_seeds_1137_token_prompt_runs_as_512_512_113_unpadded_and_512_512_171_padded() -> None:
    assert plan_prefill(0, 1137, 512, ROOMY, PaddingPolicy(enabled=False)).widths == (512, 512, 113)
    assert plan_prefill(0, 1137, 512, ROOMY).widths == (512, 512, 171)


def test_the_seeds_1200_token_prompt_runs_as_512_512_176_unpadded_and_512_512_342_padded() -> None:
    assert plan_prefill(0, 1200, 512, ROOMY, PaddingPolicy(enabled=False)).widths == (512, 512, 176)
    assert plan_prefill(0, 1200, 512, ROOMY).widths == (512, 512, 342)


def test_chunks_start_at_the_past_length_and_cover_the_prompt_once() -> None:
    plan = plan_prefill(300, 1137, 512, ROOMY)
    assert [f.past for f in plan.forwards] == [300, 812, 1324]
    assert [f.start for f in plan.forwards] == [0, 512, 1024]
    assert plan.real_rows == 1137
    assert plan.padded_rows == 171 - 113


def test_a_span_below_the_chunk_cuts_smaller_forwards_whose_widths_stay_on_the_chunks_ladder() -> None:
    plan = plan_prefill(100, 1137, 512, ROOMY, span=171)
    assert [f.rows for f in plan.forwards] == [171] * 6 + [111]
    assert set(plan.widths) <= set(ladder_widths(512)) and plan.widths[-1] == 171
    assert [f.past for f in plan.forwards] == [100 + 171 * i for i in range(7)]
    assert plan_prefill(0, 1137, 512, ROOMY, span=4096).widths == (512, 512, 171)


def test_a_zero_chunk_width_runs_the_whole_prompt_in_one_exact_forward() -> None:
    assert chunk_spans(1000, 0) == ((0, 1000),)
    assert plan_prefill(0, 1000, 0, ROOMY).widths == (1000,)


def test_padding_never_runs_past_the_kv_capacity() -> None:
    plan = plan_prefill(90, 5, 64, Limits(capacity=100))
    assert plan.widths == (5,)


def test_padding_never_runs_past_the_rotary_cache() -> None:
    plan = plan_prefill(90, 5, 64, Limits(capacity=4096, rotary_rows=100))
    assert plan.widths == (5,)


def test_a_prompt_over_capacity_is_refused_with_its_numbers() -> None:
    with pytest.raises(CapacityExceeded, match="1000 tokens in the session \\+ 100 new"):
        plan_prefill(1000, 100, 64, Limits(capacity=1024))


def test_the_switch_turns_padding_off() -> None:
    plan = plan_prefill(0, 30, 64, ROOMY, PaddingPolicy(enabled=False))
    assert plan.widths == (30,)
    assert plan.padding.refusal is PaddingRefusal.DISABLED


def test_recurrent_state_decoders_are_never_padded() -> None:
    plan = plan_prefill(0, 30, 64, ROOMY, PaddingPolicy(recurrent_state=True))
    assert plan.widths == (30,)
    assert plan.padding.refusal is PaddingRefusal.RECURRENT_STATE


def test_a_session_whose_self_check_tripped_is_never_padded_again() -> None:
    plan = plan_prefill(0, 30, 64, ROOMY, PaddingPolicy(session_padding_on=False))
    assert plan.widths == (30,)
    assert plan.padding.refusal is PaddingRefusal.SELF_CHECK


def test_per_token_ports_are_named_for_widening() -> None:
    ports = (PortShape("inputs_embeds", (1, 30, 64)), PortShape("features", (1, 30, 8)))
    plan = plan_prefill(0, 30, 64, ROOMY, ports=ports)
    assert plan.padding.allowed
    assert plan.padding.per_token_ports == ("inputs_embeds", "features")
    assert plan.widths == (44,)


def test_one_port_not_shaped_1_rows_drops_the_whole_padding_plan() -> None:
    ports = (PortShape("features", (1, 30, 8)), PortShape("bias", (64,)))
    plan = plan_prefill(0, 30, 64, ROOMY, ports=ports)
    assert not plan.padding.allowed
    assert plan.padding.refusal is PaddingRefusal.PORT_NOT_PER_TOKEN
    assert "bias" in plan.padding.detail
    assert plan.widths == (30,)


def test_the_planner_imports_without_onnxruntime_numpy_or_cupy() -> None:
    code = (
        "import sys\n"
        "for name in ('onnxruntime', 'numpy', 'cupy'): sys.modules[name] = None\n"
        "import engine.planner\n"
        "print(engine.planner.prefill_query_width(113, 512))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "171"


def test_a_model_declaring_no_chunk_gets_512_clamped_to_the_capacity() -> None:
    assert chunk_width(None, None, 4096) == 512
    assert chunk_width(None, None, 300) == 300


def test_the_servers_chunk_size_wins_and_zero_turns_chunking_off() -> None:
    assert chunk_width(64, 128, 4096) == 128
    assert chunk_width(None, 0, 4096) == 0
    assert ladder_widths(chunk_width(None, 0, 4096)) == ()


def test_a_models_own_chunk_declaration_wins_over_the_default() -> None:
    assert chunk_width(32, None, 4096) == 32
    assert chunk_width(0, None, 4096) == 0
