"""The seed's global switch is read by the config module, and only there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from service.config import PADDING_SWITCH, load_config, padding_enabled
from tests.engine.helpers import load, prompt

ROOT = Path(__file__).resolve().parents[2]


def test_onnx_genai_prefill_query_padding_0_turns_padding_off() -> None:
    assert padding_enabled({}) is True
    assert padding_enabled({PADDING_SWITCH: "1"}) is True
    assert padding_enabled({PADDING_SWITCH: "0"}) is False
    assert load_config({PADDING_SWITCH: "0"}).padding is False


def test_the_switch_reaches_the_engine_through_the_config(model_dir) -> None:
    options = load_config({PADDING_SWITCH: "0"}).engine_options()
    engine = load(model_dir(), padding=options.padding)
    assert [r.width for r in engine.prefill(engine.open_session(), prompt(30))] == [30]


def test_no_module_but_the_config_reads_the_environment() -> None:
    found = subprocess.run(
        ["git", "grep", "-nE", r"os\.(getenv|environ)", "--", "*.py", ":!tests", ":!**/config.py"],
        cwd=ROOT, capture_output=True, text=True)
    assert found.stdout == ""
