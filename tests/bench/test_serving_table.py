"""bench/serving_table.py: a sweep's row says what the server's processes and threads spent."""

from __future__ import annotations

from bench.serving_table import core


def test_the_core_shows_its_cores_and_its_busiest_thread_where_frontends_ran_beside_it() -> None:
    load = {"core_cores": 1.05, "server_cores": 2.3, "core_threads": [["812", 0.62], ["main", 0.2]]}
    assert core(load) == " (1.05: 0.62)"
    assert core({**load, "core_threads": None}) == " (1.05)"
    assert core({**load, "server_cores": 1.05}) == ""  # one process: nothing to single out
