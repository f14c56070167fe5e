"""Directories as onnxruntime-genai's builder writes them, served through a real server.

No chunk size declared, transformers' TokenizersBackend class, Llama 3's chat
template; and a tokenizer nothing can read, which leaves the server on token ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from proto.ladder.v1 import ladder_pb2 as pb
from service.loading import read_tokenizer
from tests.support.builder_style import BOS, LLAMA3_SPECIALS, builder_style_model
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config

CHAT = pb.Chat(
    messages=[
        pb.ChatMessage(role="system", content="Be brief."),
        pb.ChatMessage(role="user", content="What is the capital of France?"),
    ]
)
LLAMA3_PROMPT = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


@pytest.fixture(scope="module")
def builder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builder_style_model(tmp_path_factory.mktemp("builder"))


@pytest.fixture(scope="module")
def unreadable_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builder_style_model(
        tmp_path_factory.mktemp("unreadable"), tokenizer_class="WeirdTokenizer", tokenizer_type="WordLevel"
    )


@pytest.fixture(scope="module")
def builder_server(builder_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(builder_dir))
    yield running
    running.close()


def with_template(served_model: Path, path: Path, template: str) -> Path:
    """`served_model`'s files (linked) with `template` as its chat_template.jinja."""
    path.mkdir()
    for entry in served_model.iterdir():
        (path / entry.name).symlink_to(entry)
    (path / "chat_template.jinja").write_text(template)
    return path


def model_info(server: RunningServer) -> pb.ModelInfo:
    return server.stub.GetModelInfo(pb.GetModelInfoRequest())


def test_a_model_declaring_no_chunk_width_runs_on_the_ladder_of_512(builder_server: RunningServer) -> None:
    info = model_info(builder_server)
    assert (info.chunk_size, list(info.ladder)) == (512, [171, 342, 512])
    plan = builder_server.stub.Generate(greedy_request(prompt_ids(600, seed=4), 2)).prefill
    assert list(plan.widths) == [512, 171]  # 512 real rows, then 88 padded onto the first rung


def test_the_default_chunk_is_clamped_to_the_capacity_and_zero_turns_chunking_off(builder_dir: Path) -> None:
    for changes, chunk, ladder in (({"capacity": 300}, 300, [100, 200, 300]), ({"chunk_size": 0}, 0, [])):
        running = RunningServer(server_config(builder_dir, warm_up=False, **changes))
        try:
            info = model_info(running)
            assert (info.chunk_size, list(info.ladder)) == (chunk, ladder)
        finally:
            running.close()


def test_with_padding_off_the_model_info_lists_no_ladder(builder_dir: Path) -> None:
    running = RunningServer(server_config(builder_dir, warm_up=False, padding=False))
    try:
        info = model_info(running)
        assert (info.chunk_size, list(info.ladder), info.padding_enabled) == (512, [], False)
        plan = running.stub.Generate(greedy_request(prompt_ids(600, seed=4), 2)).prefill
        assert list(plan.widths) == [512, 88]
    finally:
        running.close()


def test_a_tokenizers_backend_class_is_read_and_the_users_config_is_left_as_it_was(
    builder_server: RunningServer, builder_dir: Path
) -> None:
    assert model_info(builder_server).has_tokenizer
    assert '"tokenizer_class": "TokenizersBackend"' in (builder_dir / "tokenizer_config.json").read_text()
    ids = list(builder_server.stub.Tokenize(pb.TokenizeRequest(text="<|eot_id|>hello")).ids)
    assert ids[0] == LLAMA3_SPECIALS["<|eot_id|>"]
    text = builder_server.stub.Detokenize(pb.DetokenizeRequest(ids=ids)).text
    assert text == "hello"


def test_a_chat_prompt_is_rendered_with_the_models_own_template(builder_server: RunningServer) -> None:
    by_chat = list(builder_server.stub.Tokenize(pb.TokenizeRequest(chat=CHAT)).ids)
    by_text = list(builder_server.stub.Tokenize(pb.TokenizeRequest(text=LLAMA3_PROMPT)).ids)
    assert by_chat == by_text
    assert by_chat[0] == BOS and by_chat.count(BOS) == 1


def test_a_role_the_template_drops_or_refuses_is_invalid_argument(builder_dir: Path, tmp_path: Path) -> None:
    phi3_dir = with_template(
        builder_dir,
        tmp_path / "phi3",
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|user|>\n' + m['content'] + '<|end|>\n' }}"
        "{% elif m['role'] == 'system' %}{{ raise_exception('no system turns here') }}{% endif %}"
        "{% endfor %}",
    )
    running = RunningServer(server_config(phi3_dir, warm_up=False))
    try:
        for role, says in (
            ("function", "no place for a message of role 'function'"),
            ("system", "no system turns"),
        ):
            chat = pb.Chat(
                messages=[pb.ChatMessage(role=role, content="42"), pb.ChatMessage(role="user", content="Hi")]
            )
            with pytest.raises(grpc.RpcError) as err:
                running.stub.Generate(pb.GenerateRequest(prompt=pb.Prompt(chat=chat)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert says in err.value.details()
    finally:
        running.close()


def test_a_template_that_does_not_compile_fails_chat_only(builder_dir: Path, tmp_path: Path) -> None:
    broken = with_template(builder_dir, tmp_path / "broken", "{% for m in messages %}{{ m['content'] }}")
    running = RunningServer(server_config(broken, warm_up=False))
    try:
        assert model_info(running).has_tokenizer
        assert running.stub.Tokenize(pb.TokenizeRequest(text="hello")).ids
        with pytest.raises(grpc.RpcError) as err:
            running.stub.Tokenize(pb.TokenizeRequest(chat=CHAT))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "does not compile" in err.value.details()
    finally:
        running.close()


@pytest.mark.parametrize("kind", ["chat", "600 ids, chunked and padded"])
def test_greedy_tokens_equal_onnxruntime_genai_on_the_same_directory(
    builder_server: RunningServer, builder_dir: Path, kind: str
) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    if kind == "chat":
        prompt = pb.Prompt(chat=CHAT)
        ids = list(builder_server.stub.Tokenize(pb.TokenizeRequest(chat=CHAT)).ids)
    else:
        ids = prompt_ids(600, seed=9)
        prompt = pb.Prompt(tokens=pb.TokenIds(ids=ids))
    ours = builder_server.stub.Generate(
        pb.GenerateRequest(prompt=prompt, stopping=pb.StoppingOptions(max_new_tokens=16))
    )
    model = og.Model(str(builder_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + 16)  # both stop at an EOS
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    theirs = []
    while not generator.is_done():
        generator.generate_next_token()
        theirs.append(int(generator.get_next_tokens()[0]))
    assert list(ours.token_ids) == theirs
    assert ours.usage.prompt_tokens == len(ids) and len(theirs) >= 8


def test_an_unreadable_tokenizer_is_one_warning_at_start_not_an_exit(unreadable_dir: Path) -> None:
    with capture_logs() as logs:
        assert read_tokenizer(unreadable_dir) is None
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["tokenizer_unreadable"]
    assert "WeirdTokenizer" in warnings[0]["reason"]


def test_without_a_readable_tokenizer_token_ids_are_served_and_text_is_failed_precondition(
    unreadable_dir: Path,
) -> None:
    running = RunningServer(server_config(unreadable_dir, warm_up=False))
    try:
        assert not model_info(running).has_tokenizer
        reply = running.stub.Generate(greedy_request(prompt_ids(20, seed=5), 4))
        assert len(reply.token_ids) == 4 and reply.text == ""
        refused = [
            lambda: running.stub.Generate(pb.GenerateRequest(prompt=pb.Prompt(text="hello"))),
            lambda: running.stub.Generate(pb.GenerateRequest(prompt=pb.Prompt(chat=CHAT))),
            lambda: running.stub.Tokenize(pb.TokenizeRequest(text="hello")),
            lambda: running.stub.Detokenize(pb.DetokenizeRequest(ids=[5, 6])),
        ]
        for call in refused:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "send token ids" in err.value.details()
    finally:
        running.close()
