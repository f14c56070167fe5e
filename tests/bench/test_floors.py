"""The decode step's memory-bandwidth floor the H200 benchmarks report against (bench/gpu/run.py):
pure values from the model's shape."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.gpu.run import (
    H200_BANDWIDTH,
    SPECS,
    decode_floors,
    kv_bytes_per_row,
    spec_of,
    weight_bytes_per_token,
)


def test_model_names_add_packed_projections_and_int4_layers_to_a_spec() -> None:
    spec = spec_of("16x2048-packed-int4")
    assert spec.packed_projections and spec.int4_block == 32
    assert spec.hidden_size == SPECS["16x2048"].hidden_size and not spec_of("8b").int4_block
    with pytest.raises(KeyError):
        spec_of("8b-int3")


def test_the_8b_class_step_reads_about_15_gb_of_fp16_weights_and_takes_at_least_3_ms() -> None:
    floors = decode_floors(spec_of("8b"), [1], past=1000, bandwidth=H200_BANDWIDTH)
    assert 14.5e9 < floors["weight_bytes"] < 15.5e9
    assert 3.0 < floors["1"]["floor_ms"] < 3.3


def test_int4_layer_matrices_read_a_quarter_of_their_fp16_bytes_and_a_scale_per_block() -> None:
    fp16, int4 = spec_of("8b"), spec_of("8b-int4")
    head = weight_bytes_per_token(replace(fp16, num_layers=0))  # the head, its norm, one embedding row
    share = (weight_bytes_per_token(int4) - head) / (weight_bytes_per_token(fp16) - head)
    assert share == pytest.approx((0.5 + 2 / 32) / 2, rel=1e-3)  # the norms stay fp16


def test_a_wider_batch_reads_the_weights_once_and_every_rows_keys_and_values() -> None:
    spec = spec_of("16x2048")
    floors = decode_floors(spec, [1, 64], past=512, bandwidth=H200_BANDWIDTH)
    assert floors["64"]["step_bytes"] - floors["1"]["step_bytes"] == 63 * kv_bytes_per_row(spec, 512)
    assert floors["64"]["ceiling_tok_s"] > 10 * floors["1"]["ceiling_tok_s"]
