"""The seed's global switch is read by the config module, and only there."""

from __future__ import annotations

import re
from pathlib import Path

from service.config import PADDING_SWITCH, load_config, padding_enabled
from tests.support.engines import load
from tests.support.prompts import prompt_ids

ROOT = Path(__file__).resolve().parents[2]


def test_onnx_genai_prefill_query_padding_0_turns_padding_off() -> None:
    assert padding_enabled({}) is True
    assert padding_enabled({PADDING_SWITCH: "1"}) is True
    assert padding_enabled({PADDING_SWITCH: "0"}) is False
    assert load_config({PADDING_SWITCH: "0"}).padding is False


def test_the_switch_reaches_the_engine_through_the_config(model_dir) -> None:
    options = load_config({PADDING_SWITCH: "0"}).engine_options()
    engine = load(model_dir(), padding=options.padding)
    assert [r.width for r in engine.prefill(engine.open_session(), prompt_ids(30))] == [30]


ENV_READ = re.compile(r"os\.(getenv|environ)")


def modules_reading_the_environment() -> set[str]:
    """Every project source file (tests excluded) that reads the environment, by its repo path."""
    return {
        str(path.relative_to(ROOT))
        for top in ("engine", "service", "clients", "proto", "bench")
        for path in (ROOT / top).rglob("*.py")
        if ENV_READ.search(path.read_text())
    }


def test_no_module_but_the_config_reads_the_environment() -> None:
    readers = modules_reading_the_environment()
    assert "service/config.py" in readers  # the scan sees a real read, so it can fail
    assert readers == {"service/config.py"}
