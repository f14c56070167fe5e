"""Structured output through a real server on the default model (int4), issue 25: every finished
output of a JSON Schema, regex, choice or grammar constraint is in its language, greedy and sampled;
unconstrained rows decoding beside constrained ones keep their tokens; n samples, sessions, stop
strings and log-probabilities (of the constrained distribution) work with a constraint; a bad
constraint is INVALID_ARGUMENT with its reason and the server goes on serving; the metrics move.

One server for the module; requests that can share decode forwards run together on a thread pool.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.ladder.v1 import ladder_pb2 as pb
from tests.engine.test_grammar import gbnf, reference
from tests.support.rich_errors import details_of
from tests.support.servers import RunningServer, free_port, server_config
from tests.support.waiting import wait_for

CORPUS = json.loads((Path(__file__).parents[1] / "engine" / "data" / "schemas.json").read_text())
# Values with no length bound (numbers, open values, strings without maxLength) that the 135M model
# runs on past any max_new_tokens ("1234567890000..."): valid prefixes, but no output to validate.
OPEN_ENDED = {
    "string",
    "integer",
    "number",
    "type list",
    "empty schema: any value",
    "true schema",
    "nested objects",
    "array of objects",
    "formats",
    "patterns",
    "any object",
    "ten properties",
}
SERVED = [entry for entry in CORPUS if entry["name"] not in OPEN_ENDED]
FORMATS = jsonschema.FormatChecker()  # date, uuid, ipv4, email: the formats the served schemas use
MAX_NEW = 160  # the longest finished output seen is ~130 tokens (an order with three items)
SEED = 11  # sampled requests draw n = 2 samples: seeds 11 and 12
LENGTH = pb.FINISH_REASON_LENGTH
FINISHED = {pb.FINISH_REASON_EOS, pb.FINISH_REASON_STOP}
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
)


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    # Chunk 64: short prompts pad to a 22-row rung, not 171 (a CPU prefill costs per padded row).
    config = server_config(default_model("int4"), max_sessions=16, capacity=1024, chunk_size=64)
    with RunningServer(config) as running:
        yield running


def request(
    prompt: Prompt,
    constraint: pb.Constraint | None,
    new: int = MAX_NEW,
    temperature: float = 0.0,
    n: int = 1,
    ignore_eos: bool = False,
    stop: tuple[str, ...] = (),
    logprobs: pb.LogprobOptions | None = None,
) -> pb.GenerateRequest:
    """A Generate of `prompt` (text, or chat turns), greedy unless given a temperature (then seeded)."""
    if isinstance(prompt, str):
        message = pb.Prompt(text=prompt)
    else:
        message = pb.Prompt(chat=pb.Chat(messages=[pb.ChatMessage(role=r, content=c) for r, c in prompt]))
    sampling = pb.SamplingOptions(temperature=temperature, seed=SEED) if temperature else None
    stopping = pb.StoppingOptions(max_new_tokens=new, ignore_eos=ignore_eos, stop=stop)
    built = pb.GenerateRequest(prompt=message, sampling=sampling, n=n, stopping=stopping, logprobs=logprobs)
    if constraint is not None:
        built.constraint.CopyFrom(constraint)
    return built


def samples(reply: pb.Completion) -> list[pb.Sample]:
    """Every sample of a reply, sample 0 too when n is 1."""
    if reply.samples:
        return list(reply.samples)
    return [pb.Sample(text=reply.text, token_ids=reply.token_ids, finish_reason=reply.finish_reason)]


@dataclass
class Output:
    name: str
    mode: str  # "greedy" or "sampled"
    sample: pb.Sample


def greedy_and_sampled(
    server: RunningServer, name: str, prompt: Prompt, constraint: pb.Constraint, new: int = MAX_NEW
) -> list[Output]:
    """One greedy output and two sampled ones (temperature 1); the sampled request comes second, so
    it finds the greedy one's prompt held and shares it."""
    greedy = server.stub.Generate(request(prompt, constraint, new))
    sampled = server.stub.Generate(request(prompt, constraint, new, temperature=1.0, n=2))
    return [Output(name, "greedy", s) for s in samples(greedy)] + [
        Output(name, "sampled", s) for s in samples(sampled)
    ]


Prompt = str | list[tuple[str, str]]
Job = tuple[str, Prompt, pb.Constraint, int]  # a name for the outputs, the prompt, the constraint, a budget


def in_parallel(server: RunningServer, jobs: list[Job]) -> list[Output]:
    """Each job greedy and sampled, the jobs side by side (their rows share decode forwards)."""
    with ThreadPoolExecutor(16) as pool:
        return [
            output
            for outputs in pool.map(lambda job: greedy_and_sampled(server, *job), jobs)
            for output in outputs
        ]


def finished_share(outputs: list[Output], mode: str) -> float:
    of_mode = [o for o in outputs if o.mode == mode]
    return sum(o.sample.finish_reason in FINISHED for o in of_mode) / len(of_mode)


def failures(outputs: list[Output], check: Callable[[str, str], object]) -> list[tuple[str, str, str]]:
    """(name, text, why) for each finished output that `check(name, text)` raises on."""
    failed = []
    for output in outputs:
        if output.sample.finish_reason == LENGTH:
            continue
        try:
            check(output.name, output.sample.text)
        except Exception as error:  # noqa: BLE001 - any failure to parse or validate is reported
            failed.append((output.name, output.sample.text, f"{type(error).__name__}: {error}"[:200]))
    return failed


# ---------------------------------------------------------------- every kind, greedy and sampled


def schema_prompt(schema: Any) -> list[tuple[str, str]]:
    return [
        ("system", "Reply with JSON only."),
        ("user", "JSON for this schema: " + json.dumps(schema, separators=(",", ":"))),
    ]


def test_every_finished_output_of_fifty_json_schemas_parses_and_validates(server: RunningServer) -> None:
    """Read as strict mode does (no undeclared members): the default model, left free to add
    members after the declared ones, often does until MAX_NEW (the next test)."""
    assert len(SERVED) == 50
    schemas = {entry["name"]: entry["schema"] for entry in SERVED}
    outputs = in_parallel(
        server,
        [
            (name, schema_prompt(schema), pb.Constraint(json_schema=json.dumps(schema), strict=True), MAX_NEW)
            for name, schema in schemas.items()
        ],
    )

    def validate(name: str, text: str) -> None:
        jsonschema.Draft202012Validator(schemas[name], format_checker=FORMATS).validate(json.loads(text))

    assert failures(outputs, validate) == []
    unfinished = [(o.mode, o.name) for o in outputs if o.sample.finish_reason == LENGTH]
    # Recursive schemas nest as deep as the model goes (no depth cut since the pushdown engine runs
    # them): greedy, the default model keeps nesting "recursive tree" and "recursive linked list"
    # past MAX_NEW (0.90 finished, was 0.96 with recursion cut at depth 3). At temperature 1 it also
    # runs past MAX_NEW on ~5 % of the others. What must hold for every finished output is above:
    # it parses and validates.
    assert finished_share(outputs, "greedy") >= 0.85, unfinished
    assert finished_share(outputs, "sampled") >= 0.85, unfinished


def test_every_finished_output_read_as_the_spec_reads_a_schema_validates(server: RunningServer) -> None:
    """JSON Schema's reading (the default): members a schema does not declare may follow the
    declared ones, with any value; every output that finishes validates."""
    schemas = {entry["name"]: entry["schema"] for entry in SERVED[:12]}
    outputs = in_parallel(
        server,
        [
            (name, schema_prompt(schema), pb.Constraint(json_schema=json.dumps(schema)), MAX_NEW)
            for name, schema in schemas.items()
        ],
    )

    def validate(name: str, text: str) -> None:
        jsonschema.Draft202012Validator(schemas[name], format_checker=FORMATS).validate(json.loads(text))

    assert failures(outputs, validate) == []
    assert finished_share(outputs, "greedy") >= 0.75


def test_the_strict_reading_is_asked_per_request_and_writes_only_the_declared_members(
    server: RunningServer,
) -> None:
    """Where the first key starts, the spec's reading admits any key (the default model, shown
    the schema, copies it: `{"type":"object",...`), the strict one only the declared `a`; after
    the last declared member's value the strict reading never lets `,` follow (only `}`). Seen in
    the constrained alternatives of those tokens. Cached apart."""
    schema = json.dumps({"type": "object", "properties": {"a": {"enum": [1]}}, "required": ["a"]})
    top = pb.LogprobOptions(top=20)
    server.server.serving.constraints.cache()  # made on first use
    misses = server.server.serving.constraints.stats().misses
    keys: dict[bool, set[str]] = {}
    for strict in (False, True):
        constraint = pb.Constraint(json_schema=schema, strict=strict)
        reply = server.stub.Generate(request(schema_prompt(json.loads(schema)), constraint, 12, logprobs=top))
        texts = [server.stub.Detokenize(pb.DetokenizeRequest(ids=[t.id])).text for t in reply.logprobs]
        key = next(i + 1 for i in range(len(texts)) if "".join(texts[: i + 1]).replace(" ", "") == '{"')
        keys[strict] = {a.text for a in reply.logprobs[key].top if a.logprob > -math.inf}
        if strict:
            assert json.loads(reply.text) == {"a": 1} and reply.finish_reason in FINISHED
            closing = next(i for i, text in enumerate(texts) if text.startswith("}"))
            after = {a.text for a in reply.logprobs[closing].top if a.logprob > -math.inf}
            assert not any(text.startswith(",") for text in after) and "}" in after, after
    assert keys[True] and all(text.startswith("a") for text in keys[True]), keys
    assert any(not text.startswith("a") for text in keys[False]), keys
    assert server.server.serving.constraints.stats().misses == misses + 2


REGEXES = {
    r"\d{4}-\d{2}-\d{2}": "Today's date is",
    r"\(\d{3}\) \d{3}-\d{4}": "Call us at",
    r"[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10}){1,2}": "The author's full name is",
    r"(yes|no), because [a-z ]{1,30}\.": "Is water wet? Answer:",
    r"-?\d{1,3}(\.\d{1,2})?": "The temperature in Celsius is",
    r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)": "Email:",
    r"#[0-9a-f]{6}": "The color in hex is",
    r"[αβγδ]{2,5}": "Greek letters:",
    r"(café|naïve|日本語)( (café|naïve|日本語)){0,2}": "Words:",
    r"[^\n]{1,40}\n": "A one-line summary:",
}
CHOICES = {
    ("positive", "negative", "neutral"): "The sentiment of 'I love it' is",
    ("red", "green", "blue", "dark green"): "The color of grass is",
    ("a", "ab", "abc"): "Pick one:",
    ("café", "日本", "naïve ☃"): "A word:",
}
# tests/engine/data/grammars, each with a prompt and a budget its outputs finish in.
GRAMMARS: dict[str, tuple[Prompt, int]] = {
    "arithmetic": ([("user", "Write a short arithmetic expression.")], 60),
    "items": ("A shopping list.\n", 60),
    "unicode": ("Greet someone:", 60),
    # A prompt short JSON answers follow on every CPU's int4 numerics (an open-ended one ran past
    # its budget in all three outputs on an AVX2-only EPYC, and the check then proved nothing).
    "json": ([("user", 'Write the JSON object {"cat": true} and nothing else.')], 160),
}


def test_every_finished_regex_output_fully_matches(server: RunningServer) -> None:
    outputs = in_parallel(
        server, [(regex, prompt, pb.Constraint(regex=regex), 60) for regex, prompt in REGEXES.items()]
    )

    def full_match(regex: str, text: str) -> None:
        assert re.fullmatch(regex, text), "not a full match"

    assert failures(outputs, full_match) == []
    assert all(o.sample.finish_reason in FINISHED for o in outputs), [o.name for o in outputs]


def test_every_choice_output_is_one_of_the_options(server: RunningServer) -> None:
    outputs = in_parallel(
        server,
        [
            ("|".join(options), prompt, pb.Constraint(choice=pb.Choices(options=options)), 16)
            for options, prompt in CHOICES.items()
        ],
    )
    assert all(o.sample.finish_reason in FINISHED for o in outputs)
    assert [(o.name, o.sample.text) for o in outputs if o.sample.text not in o.name.split("|")] == []


def test_every_finished_grammar_output_parses_with_a_reference_parser(server: RunningServer) -> None:
    outputs = in_parallel(
        server,
        [(name, prompt, pb.Constraint(grammar=gbnf(name)), new) for name, (prompt, new) in GRAMMARS.items()],
    )
    assert failures(outputs, lambda name, text: reference(name)(text)) == []
    finished = {o.name for o in outputs if o.sample.finish_reason in FINISHED}
    assert finished == set(GRAMMARS), "a grammar none of whose outputs finished proves nothing"


# ---------------------------------------------------------------- beside free rows, n samples, sessions


def test_unconstrained_rows_decoded_beside_constrained_ones_get_their_tokens_alone(
    server: RunningServer,
) -> None:
    free = [request(prompt, None, 24, ignore_eos=True) for prompt in PROMPTS]
    alone = [list(server.stub.Generate(each).token_ids) for each in free]
    # A string of 12 characters at most: the object always closes within its 40 tokens, whatever
    # the CPU's numerics choose (with 40 characters one reply ran out of tokens inside the string).
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 12}}, "required": ["a"]}
    constrained = [
        request(prompt, pb.Constraint(json_schema=json.dumps(schema), strict=True), 40) for prompt in PROMPTS
    ]
    before = server.stats().decode
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(server.stub.Generate, [*free, *constrained]))
    after = server.stats().decode
    assert [list(r.token_ids) for r in replies[: len(free)]] == alone
    assert all(json.loads(r.text).keys() == {"a"} for r in replies[len(free) :])
    assert after.steps - before.steps < after.rows - before.rows, "the requests never shared a forward"


def test_each_of_n_samples_is_constrained(server: RunningServer) -> None:
    schema = next(entry["schema"] for entry in CORPUS if entry["name"] == "tool call")
    reply = server.stub.Generate(
        request(schema_prompt(schema), pb.Constraint(json_schema=json.dumps(schema)), temperature=1.0, n=3)
    )
    assert len(reply.samples) == 3 and all(s.finish_reason in FINISHED for s in reply.samples)
    for sample in reply.samples:
        jsonschema.validate(json.loads(sample.text), schema)
    assert len({s.text for s in reply.samples}) > 1, "three seeds at temperature 1 should not all agree"


def test_a_constrained_decode_in_a_session_is_valid_and_a_later_free_decode_is_not_held_to_it(
    server: RunningServer,
) -> None:
    ids = list(
        server.stub.Tokenize(
            pb.TokenizeRequest(
                chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="Is the sky blue?")])
            )
        ).ids
    )
    events = list(
        server.stub.Prefill(
            iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=ids)), last=True)])
        )
    )
    session = events[-1].done.session_id
    choice = pb.Constraint(choice=pb.Choices(options=["Yes, it is.", "No, it is not."]))
    answer = decoded(
        server,
        pb.DecodeRequest(
            session_id=session, constraint=choice, stopping=pb.StoppingOptions(max_new_tokens=16)
        ),
    )
    assert answer.text in choice.choice.options and answer.finish_reason == pb.FINISH_REASON_STOP
    assert answer.session_length == len(ids) + len(answer.token_ids)
    free = decoded(
        server,
        pb.DecodeRequest(session_id=session, stopping=pb.StoppingOptions(max_new_tokens=6, ignore_eos=True)),
    )
    assert len(free.token_ids) == 6 and free.finish_reason == LENGTH  # the choice would have ended it
    assert free.session_length == answer.session_length + 6
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))


def decoded(server: RunningServer, decode: pb.DecodeRequest) -> pb.Completion:
    return list(server.stub.Decode(decode))[-1].done


def test_a_stop_string_ends_a_constrained_output_before_it(server: RunningServer) -> None:
    regex = r"[a-z]{1,6}(, [a-z]{1,6}){5}"
    stopped = request(
        "Fruits: apple, pear, fig, plum, kiwi, lime\nColors:", pb.Constraint(regex=regex), 40, stop=(", ",)
    )
    reply = server.stub.Generate(stopped)
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    assert re.fullmatch(r"[a-z]{1,6}", reply.text), reply.text
    whole = server.stub.Detokenize(pb.DetokenizeRequest(ids=reply.token_ids)).text
    assert whole.startswith(reply.text + ",")


# ---------------------------------------------------------------- log-probabilities


def test_constrained_log_probabilities_are_at_least_the_free_ones_and_their_alternatives_allowed(
    server: RunningServer,
) -> None:
    # The free greedy reply has no digit in its first 9 tokens, so a no-digit constraint picks the
    # same tokens, from the same logits: renormalised over fewer tokens, each is at least as likely.
    def scored(constraint: pb.Constraint | None) -> pb.Completion:
        return server.stub.Generate(
            request(
                "The capital of France is", constraint, 9, ignore_eos=True, logprobs=pb.LogprobOptions(top=5)
            )
        )

    free, constrained = scored(None), scored(pb.Constraint(regex=r"[^0-9]*"))
    assert list(constrained.token_ids) == list(free.token_ids)
    pairs = list(zip(constrained.logprobs, free.logprobs, strict=True))
    assert all(c.logprob >= f.logprob - 1e-6 for c, f in pairs)
    assert any(c.logprob > f.logprob + 1e-4 for c, f in pairs), "digits carry some mass somewhere"
    alternatives = [a for c in constrained.logprobs for a in c.top]
    assert alternatives
    assert all(math.isfinite(a.logprob) and not re.search(r"\d", a.text) for a in alternatives)


def test_a_choices_log_probabilities_are_a_distribution_over_the_tokens_it_allows(
    server: RunningServer,
) -> None:
    options = ("yes", "no", "maybe")
    choice = pb.Constraint(choice=pb.Choices(options=options))
    top = pb.LogprobOptions(top=20)
    reply = server.stub.Generate(request("Is the sky blue? Answer:", choice, 8, logprobs=top))
    assert reply.text in options
    written = ""
    for position in reply.logprobs:
        allowed = list(position.top)
        # Fewer than 20 tokens are allowed: the list holds those only, none of probability 0.
        assert 0 < len(allowed) < 20 and all(math.isfinite(a.logprob) for a in allowed)
        assert all(any(o.startswith(written + a.text) for o in options) for a in allowed)
        assert sum(math.exp(a.logprob) for a in allowed) == pytest.approx(1.0, abs=1e-3)
        written += next(a.text for a in position.top if a.id == position.id)
    assert written == reply.text


# ---------------------------------------------------------------- refusals


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str, list[str]]:
    """The call's failure: code, message, ErrorInfo reason and the BadRequest fields."""
    got = details_of(call)
    return got.code, got.message, got.reason, got.fields


UNIQUE = (
    '{"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, '
    '"uniqueItems": true}}}'
)
BAD = [
    (
        pb.Constraint(json_schema=UNIQUE),
        "SCHEMA_UNSUPPORTED",
        "constraint.json_schema",
        "/properties/tags/uniqueItems",
    ),
    (
        pb.Constraint(json_schema='{"type": "object",'),
        "SCHEMA_INVALID",
        "constraint.json_schema",
        "not valid JSON",
    ),
    (pb.Constraint(regex="(a"), "REGEX_INVALID", "constraint.regex", "does not parse"),
    (pb.Constraint(regex=r"(a)\1"), "REGEX_UNSUPPORTED", "constraint.regex", "backreference"),
    (pb.Constraint(regex="(a|b)*a(a|b){20}"), "CONSTRAINT_TOO_LARGE", "constraint.regex", "states"),
    (
        pb.Constraint(grammar='root ::= "a" item\nitem ::= [a-'),
        "GRAMMAR_INVALID",
        "constraint.grammar",
        "line 2 column",
    ),
    (pb.Constraint(grammar='root ::= "a" b'), "GRAMMAR_INVALID", "constraint.grammar", "line 1 column 14"),
    (
        pb.Constraint(choice=pb.Choices()),
        "CONSTRAINT_EMPTY",
        "constraint.choice.options",
        "at least one option",
    ),
    (pb.Constraint(), "CONSTRAINT_REQUIRED", "constraint", "one of json_schema, regex, choice or grammar"),
]


@pytest.mark.parametrize(("constraint", "reason", "field", "says"), BAD, ids=[b[1] + "-" + b[2] for b in BAD])
def test_a_bad_constraint_is_invalid_argument_with_its_reason_and_field(
    server: RunningServer, constraint: pb.Constraint, reason: str, field: str, says: str
) -> None:
    code, message, got_reason, fields = refusal(lambda: server.stub.Generate(request("Hi", constraint, 4)))
    assert (code, got_reason, fields) == (grpc.StatusCode.INVALID_ARGUMENT, reason, [field])
    assert says in message, message


def test_after_bad_constraints_the_server_serves_and_holds_no_slot(server: RunningServer) -> None:
    events = list(server.stub.Prefill(iter([pb.PrefillRequest(prompt=pb.Prompt(text="Hello"), last=True)])))
    session = events[-1].done.session_id
    four = pb.StoppingOptions(max_new_tokens=4)
    for constraint, reason, _, _ in BAD:
        bad = pb.DecodeRequest(session_id=session, constraint=constraint, stopping=four)
        assert refusal(lambda bad=bad: decoded(server, bad))[2] == reason
        stream = request("Hi", constraint, 4)
        assert refusal(lambda stream=stream: next(server.stub.GenerateStream(stream)))[2] == reason
    good = decoded(
        server,
        pb.DecodeRequest(
            session_id=session,
            constraint=pb.Constraint(regex="[0-9]{3}"),
            stopping=pb.StoppingOptions(max_new_tokens=8),
        ),
    )
    assert re.fullmatch("[0-9]{3}", good.text)
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    assert server.stub.Generate(request("Hi", pb.Constraint(regex="(hi|bye)"), 4)).text in ("hi", "bye")
    wait_for(lambda: server.stats().sessions_open == 0, what="every session and slot to be released")


# ---------------------------------------------------------------- metrics


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def test_constrained_requests_compile_times_and_mask_times_are_counted(server: RunningServer) -> None:
    port = free_port()
    server.server.start_metrics(port)
    regex = pb.Constraint(regex="[a-z]{2,4}-metrics")  # compiled by no other test
    before = scrape(port)
    for _ in range(2):  # compiled, then found in the cache
        server.stub.Generate(request("Say something:", regex, 12))
    after = scrape(port)

    def moved(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("ladder_constrained_requests_total", kind="regex") == 2
    assert moved("ladder_constraint_compile_seconds_count", cache="miss") == 1
    assert moved("ladder_constraint_compile_seconds_count", cache="hit") == 1
    assert moved("ladder_constraint_compile_seconds_sum", cache="miss") > 0
    assert moved("ladder_constraint_mask_seconds_per_token_count") == 2
