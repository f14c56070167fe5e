"""The one config object: flags over LADDER_* environment over defaults; the seed's padding switch."""

from __future__ import annotations

import pytest

from service.config import PADDING_SWITCH, Config, config_from, load_config, padding_enabled


def test_defaults_are_the_documented_ports_and_limits() -> None:
    config = load_config({}, [])
    assert (config.port, config.metrics_port, config.drain_seconds) == (50051, 9090, 20.0)
    assert config.model == "default" and config.padding and not config.tls and not config.auth


def test_a_flag_wins_over_the_environment_and_the_environment_over_the_default() -> None:
    env = {"LADDER_PORT": "6000", "LADDER_MAX_SESSIONS": "3", "LADDER_CHUNK_SIZE": "128"}
    config = load_config(env, ["--port", "7000"])
    assert (config.port, config.max_sessions, config.chunk_size) == (7000, 3, 128)
    assert config.engine_options().max_sessions == 3 and config.engine_options().chunk_size == 128


def test_the_seeds_switch_turns_padding_off_unless_a_flag_says_otherwise() -> None:
    assert not padding_enabled({PADDING_SWITCH: "0"})
    assert not load_config({PADDING_SWITCH: "0"}).padding
    assert load_config({PADDING_SWITCH: "0"}, ["--padding", "1"]).padding
    assert not load_config({}, ["--padding", "off"]).engine_options().padding


def test_auth_tokens_and_tls_files_come_from_the_environment() -> None:
    config = load_config({"LADDER_AUTH_TOKENS": "alice=a, b", "LADDER_TLS_CERT": "c.pem",
                          "LADDER_TLS_KEY": "k.pem"})
    assert config.auth_tokens == ("alice=a", "b") and config.tls


@pytest.mark.parametrize("env", [
    {"LADDER_PROVIDER": "tpu"}, {"LADDER_TLS_CERT": "c.pem"}, {"LADDER_TLS_CLIENT_CA": "ca.pem"},
    {"LADDER_POD_NAME": "a.b"}, {"LADDER_MAX_SESSIONS": "0"}, {"LADDER_MODEL_PRECISION": "int3"},
])
def test_settings_that_cannot_work_are_refused_at_start(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        load_config(env)


def test_the_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().port = 1  # type: ignore[misc]


def test_typed_flag_values_from_another_parser_pass_through() -> None:
    config = config_from({"port": 0, "padding": False, "auth_tokens": ["t"], "command": "serve"}, {})
    assert (config.port, config.padding, config.auth_tokens) == (0, False, ("t",))


def test_the_default_model_precision_is_fp32_and_int4_can_be_chosen() -> None:
    assert load_config({}).model_precision == "fp32"
    assert load_config({"LADDER_MODEL_PRECISION": "int4"}).model_precision == "int4"
    assert load_config({}, argv=["--model-precision", "int4"]).model_precision == "int4"


def test_rewritten_graphs_live_under_the_model_cache_and_a_read_only_model_is_never_rewritten() -> None:
    options = load_config({"LADDER_MODEL_CACHE": "/srv/ladder"}, []).engine_options()
    assert str(options.graph_cache_dir) == "/srv/ladder/graphs" and not options.graph_read_only
    assert load_config({}, ["--model-read-only", "true"]).engine_options().graph_read_only
