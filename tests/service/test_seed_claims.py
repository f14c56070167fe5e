"""The seed's claims through the whole service: two real servers, padding on and off
(the ONNX_GENAI_PREFILL_QUERY_PADDING=0 switch), real channels, real engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.config import PADDING_SWITCH, load_config
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config

# Remainders at chunk 64: 37, 26, 12, 8, 59, 44, 13, 30, 6, 31 -> ten different unpadded widths,
# more than the variant cache holds beside the batch widths (3 + 5).
LENGTHS = (37, 90, 140, 200, 251, 300, 333, 350, 390, 415)


@pytest.fixture(scope="module")
def servers(served_model: Path) -> Iterator[dict[str, RunningServer]]:
    padding_off = load_config({PADDING_SWITCH: "0"}).padding
    # Speculation off: its verification shapes are a bounded set of their own
    # (tests/engine/test_speculation.py), and these claims are the prefill path's.
    running = {
        "on": RunningServer(server_config(served_model, speculate="off")),
        "off": RunningServer(server_config(served_model, padding=padding_off, speculate="off")),
    }
    yield running
    for server in running.values():
        server.close()


def _generate_all(server: RunningServer) -> list[list[int]]:
    return [list(server.stub.Generate(greedy_request(prompt_ids(n, seed=n), 32)).token_ids) for n in LENGTHS]


def test_greedy_output_through_the_service_is_identical_with_padding_on_and_off(servers) -> None:
    assert _generate_all(servers["on"]) == _generate_all(servers["off"])
    on, off = servers["on"].stats(), servers["off"].stats()
    assert on.padded_rows > 0 and off.padded_rows == 0


def test_a_second_pass_over_the_same_lengths_prepares_no_new_variant_only_with_padding(servers) -> None:
    for server in servers.values():
        _generate_all(server)  # the first pass (again, if another test ran it already)
    before = {name: server.stats().variants.prepared for name, server in servers.items()}
    for server in servers.values():
        _generate_all(server)
    after = {name: server.stats().variants for name, server in servers.items()}
    assert after["on"].prepared == before["on"]
    assert sorted(e.width for e in after["on"].held if not e.batch) == [22, 44, 64]
    assert sorted(e.batch for e in after["on"].held if e.batch) == [1, 2, 4, 8, 12]  # the batch ladder
    assert after["off"].prepared > before["off"] and after["off"].evictions > 0
