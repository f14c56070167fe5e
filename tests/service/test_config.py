"""The one config object: flags over LADDER_* environment over defaults; the seed's padding switch."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path

import onnx
import pytest

from service.config import (
    PADDING_SWITCH,
    Config,
    ConfigError,
    build_parser,
    config_from,
    env_name,
    flag_name,
    load_config,
    padding_enabled,
    parse_setting,
)

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_the_documented_ports_and_limits() -> None:
    config = load_config({}, [])
    assert (config.port, config.metrics_port, config.drain_seconds) == (50051, 9464, 20.0)
    assert (config.max_new_tokens, config.default_max_new_tokens) == (1024, 256)
    assert config.model == "default" and config.padding and not config.tls and not config.auth


def test_the_configuration_page_lists_every_field_with_its_flag_environment_name_and_default() -> None:
    rows = {}
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        found = re.match(r"^\| `(--[a-z0-9-]+)` \| `([A-Z0-9_]+)` \| `([^`|]*)` \|", line)
        if found:
            rows[found.group(1)] = (found.group(2), found.group(3))
    expected = {}
    for field in fields(Config):
        default = field.default if field.default is not MISSING else field.default_factory()  # type: ignore[misc]
        expected[flag_name(field.name)] = (env_name(field.name), "auto" if default is None else repr(default))
    assert rows == expected


def test_frontends_default_to_two_on_cuda_and_none_on_cpu_unless_asked() -> None:
    assert load_config({}, []).frontend_processes == 0
    assert load_config({}, ["--provider", "cuda"]).frontend_processes == 2
    assert load_config({}, ["--provider", "cuda", "--frontends", "0"]).frontend_processes == 0
    assert load_config({"LADDER_FRONTENDS": "3"}, []).frontend_processes == 3


def test_every_field_reads_back_its_own_default_from_text_by_its_type() -> None:
    defaults, kinds = Config(), typing.get_type_hints(Config)
    for field in fields(Config):
        default = getattr(defaults, field.name)
        text = (
            "auto"
            if default is None
            else ",".join(default)
            if isinstance(default, tuple)
            else str(default).lower()
            if isinstance(default, bool)
            else str(default)
        )
        parsed = parse_setting(field.name, text, kinds[field.name], field.name)
        assert parsed == default and type(parsed) is type(default), field.name


def test_an_optional_field_is_parsed_as_its_inner_type_or_auto_and_an_unknown_type_is_refused() -> None:
    assert parse_setting("x", "0.5", float | None, "--x") == 0.5
    assert parse_setting("x", "auto", float | None, "--x") is None
    assert parse_setting("x", "7", int | None, "--x") == 7
    with pytest.raises(ConfigError, match="a number or auto"):
        parse_setting("x", "half", float | None, "--x")
    with pytest.raises(TypeError, match="no parser"):
        parse_setting("x", "[1]", list[int], "--x")


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


def test_auth_tokens_and_tls_files_come_from_the_environment(tmp_path: Path) -> None:
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("-----")
    config = load_config(
        {
            "LADDER_AUTH_TOKENS": "alice=a, b",
            "LADDER_TLS_CERT": str(tmp_path / "c.pem"),
            "LADDER_TLS_KEY": str(tmp_path / "k.pem"),
        }
    )
    assert config.auth_tokens == ("alice=a", "b") and config.tls


@pytest.mark.parametrize(
    "env",
    [
        {"LADDER_PROVIDER": "tpu"},
        {"LADDER_TLS_CERT": "c.pem"},
        {"LADDER_TLS_CLIENT_CA": "ca.pem"},
        {"LADDER_POD_NAME": "a.b"},
        {"LADDER_MAX_SESSIONS": "0"},
        {"LADDER_MODEL_PRECISION": "int3"},
        {"LADDER_MAX_NEW_TOKENS": "100", "LADDER_DEFAULT_MAX_NEW_TOKENS": "200"},
    ],
)
def test_settings_that_cannot_work_are_refused_at_start(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_config(env, exit_on_error=False)


def test_a_lower_limit_alone_caps_the_unset_default_instead_of_refusing_it() -> None:
    assert load_config({"LADDER_MAX_NEW_TOKENS": "100"}, exit_on_error=False).max_new_tokens == 100


def test_the_deterministic_switch_reaches_the_engine() -> None:
    assert load_config({}, ["--deterministic", "true"]).engine_options().deterministic
    assert not load_config({}).engine_options().deterministic


def test_the_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().port = 1  # type: ignore[misc]


def test_typed_flag_values_from_another_parser_pass_through() -> None:
    config = config_from({"port": 0, "padding": False, "auth_tokens": ["t"], "command": "serve"}, {})
    assert (config.port, config.padding, config.auth_tokens) == (0, False, ("t",))


def test_the_default_model_is_int4_on_cpu_fp16_on_cuda_and_fp32_can_be_chosen() -> None:
    assert load_config({}).default_model_precision == "int4"
    assert load_config({"LADDER_PROVIDER": "cuda"}).default_model_precision == "fp16"
    assert load_config({"LADDER_MODEL_PRECISION": "fp32"}).default_model_precision == "fp32"
    assert load_config({}, argv=["--model-precision", "fp32"]).default_model_precision == "fp32"
    with pytest.raises(ConfigError, match="one of auto, int4, fp16, fp32"):
        load_config({"LADDER_MODEL_PRECISION": "int8"}, exit_on_error=False)


@pytest.mark.parametrize(
    ("argv", "env", "named", "allowed"),
    [
        (["--max-sessions", "abc"], {}, "--max-sessions='abc'", "a whole number >= 1"),
        ([], {"LADDER_MAX_SESSIONS": "abc"}, "LADDER_MAX_SESSIONS='abc'", "a whole number >= 1"),
        (["--log-level", "loud"], {}, "--log-level='loud'", "one of debug, info, warning, error"),
        (["--padding", "maybe"], {}, "--padding='maybe'", "1, true, on, yes, 0, false, off, no"),
        ([], {"LADDER_WARM_UP": "yes please"}, "LADDER_WARM_UP='yes please'", "0, false, off, no"),
        ([], {PADDING_SWITCH: "maybe"}, f"{PADDING_SWITCH}='maybe'", "0, false, off, no"),
        (["--port", "70000"], {}, "--port=70000", "a whole number from 0 to 65535"),
        (["--drain-seconds", "soon"], {}, "--drain-seconds='soon'", "a number >= 0"),
        (["--chunk-size", "-1"], {}, "--chunk-size=-1", "a whole number or auto >= 0"),
        (["--provider", "tpu"], {}, "--provider='tpu'", "one of cpu, cuda"),
    ],
)
def test_a_bad_flag_or_variable_is_one_line_naming_it_its_value_and_what_is_allowed(
    argv: list[str], env: dict[str, str], named: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env, argv, exit_on_error=False)
    message = str(refused.value)
    assert "\n" not in message and named in message and allowed in message


@pytest.mark.parametrize("value", ["1", "true", "ON", "yes", "0", "false", "Off", "NO"])
def test_booleans_take_exactly_the_documented_words_in_any_case(value: str) -> None:
    expected = value.lower() in {"1", "true", "on", "yes"}
    assert load_config({"LADDER_WARM_UP": value}).warm_up is expected
    assert load_config({}, ["--lookahead", value]).lookahead is expected


def test_an_empty_environment_variable_counts_as_unset() -> None:
    config = load_config({"LADDER_MAX_SESSIONS": "", "LADDER_WARM_UP": "", PADDING_SWITCH: ""})
    assert (config.max_sessions, config.warm_up, config.padding) == (8, True, True)
    with pytest.raises(ConfigError, match="--max-sessions=''"):
        load_config({}, ["--max-sessions", ""], exit_on_error=False)


def test_choices_are_read_in_any_case_and_kept_in_lower_case() -> None:
    config = load_config({"LADDER_LOG_LEVEL": "DEBUG"}, ["--provider", "CPU"])
    assert (config.log_level, config.provider) == ("debug", "cpu")


def test_each_field_is_parsed_by_its_type_not_by_its_annotation_text() -> None:
    config = load_config(
        {
            "LADDER_CAPACITY": "auto",
            "LADDER_SESSION_IDLE_SECONDS": "1.5",
            "LADDER_AUTH_TOKENS": "a=x,,b=y",
            "LADDER_DEFAULT_MAX_NEW_TOKENS": "16",
        }
    )
    assert config.capacity is None and config.session_idle_seconds == 1.5
    assert config.auth_tokens == ("a=x", "b=y") and config.default_max_new_tokens == 16


def test_serve_help_shows_each_default_and_its_variable() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "(default: 9464) [env LADDER_METRICS_PORT]" in text
    assert "(default: 256) [env LADDER_DEFAULT_MAX_NEW_TOKENS]" in text
    assert "one of debug, info, warning, error (default: info)" in text


def serve(
    args: list[str], env: dict[str, str] | None = None, module: tuple[str, ...] = ("service",)
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", *module, *args]
    return subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


@pytest.mark.parametrize("module", [("service",), ("clients.python.cli", "serve")])
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--max-sessions", "abc"], {}, "--max-sessions='abc'"),
        (["--log-level", "loud"], {}, "--log-level='loud'"),
        (["--padding", "maybe"], {}, "--padding='maybe'"),
        ([], {"LADDER_MAX_SESSIONS": "abc"}, "LADDER_MAX_SESSIONS='abc'"),
        (["--no-such-flag"], {}, "--no-such-flag"),
        (["--model", "/no/such/model"], {}, "--model='/no/such/model'"),
        ([], {"LADDER_TLS_CERT": "/no/c.pem", "LADDER_TLS_KEY": "/no/k.pem"}, "LADDER_TLS_CERT='/no/c.pem'"),
    ],
)
def test_serve_refuses_a_bad_setting_with_one_line_and_exit_code_2(
    module: tuple[str, ...], args: list[str], env: dict[str, str], named: str
) -> None:
    done = serve(args, env, module)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_serve_says_in_one_line_why_a_model_directory_cannot_be_served(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text('{"model": {"decoder": {"filename": "model.onnx"}}}')
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    done = serve(["--model", str(tmp_path), "--port", "0", "--metrics-port", "0", "--http-port", "0"])
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and not any(line.startswith("Traceback") for line in lines)
    assert lines[-1].startswith(f"ladder serve: cannot serve model '{tmp_path}':")
    assert any(line.startswith('{"error": ') for line in lines), "the traceback is in the JSON log"


def test_a_model_config_without_its_keys_names_the_file_and_the_key(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text("{}")
    done = serve(["--model", str(tmp_path), "--port", "0", "--metrics-port", "0", "--http-port", "0"])
    assert done.returncode == 2
    assert "genai_config.json has no 'model' object" in done.stderr.splitlines()[-1]


def test_a_graph_that_is_no_decoder_is_a_bad_setting_one_line_and_exit_code_2(tmp_path: Path) -> None:
    port = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [port],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    onnx.save(onnx.helper.make_model(graph), str(tmp_path / "model.onnx"))
    (tmp_path / "genai_config.json").write_text('{"model": {"decoder": {"filename": "model.onnx"}}}')
    done = serve(["--model", str(tmp_path), "--port", "0", "--metrics-port", "0", "--http-port", "0"])
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and not any(line.startswith("Traceback") for line in lines)
    assert lines[-1] == (
        f"ladder serve: cannot serve model '{tmp_path}': "
        f"{tmp_path}: needs input_ids or inputs_embeds, attention_mask, logits"
    )
    assert not any("model_load_failed" in line for line in lines), "a bad setting is no unexpected failure"


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--port", "gRPC port (--port/LADDER_PORT)"),
        ("--metrics-port", "metrics port (--metrics-port"),
        ("--http-port", "HTTP port (--http-port/LADDER_HTTP_PORT"),
    ],
)
def test_serve_names_a_port_another_process_holds_in_one_line(flag: str, named: str, tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text("{}")  # a model directory; ports are bound before it loads
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {"--port": "0", "--metrics-port": "0", "--http-port": "0", flag: str(port)}
        done = serve(["--model", str(tmp_path), *(part for pair in ports.items() for part in pair)])
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and f"{named}" in done.stderr and str(port) in done.stderr
    assert "in use" in done.stderr and "Traceback" not in done.stderr


def test_rewritten_graphs_live_under_the_model_cache_and_a_read_only_model_is_never_rewritten() -> None:
    options = load_config({"LADDER_MODEL_CACHE": "/srv/ladder"}, []).engine_options()
    assert str(options.graph_cache_dir) == "/srv/ladder/graphs" and not options.graph_read_only
    assert load_config({}, ["--model-read-only", "true"]).engine_options().graph_read_only
