"""Speculative decoding (issue #44) through a real server: what a client gets with `--speculate
lookup` is what it gets with it off, token for token, on the default model in fp32 (whose
verification rows are its decode rows to ~3e-5 nats on every CPU): greedy and seeded samples,
stop strings and stop ids, log-probabilities, sessions decoded in several calls and rewound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.errors import InvalidInput
from engine.planner.drafts import Costs
from engine.sampling import Sampler, SamplingParams
from proto.ladder.v1 import ladder_pb2 as pb
from service.calls import Stopping
from service.config import Config
from service.http.openai import openai_call
from service.worker.speculation import Speculation
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import part, prefill

PASSAGE = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk, carrying a lamp, a "
    "notebook and a flask of tea. From the top he watched the fishing boats return to the harbour "
    "and wrote down the name of each one as it passed the rocks."
)
GROUNDED = (
    f"Copy the passage.\nPassage: {PASSAGE}\nCopy: The lighthouse keeper",
    f"{PASSAGE}\nQuestion: What did the keeper carry?\nAnswer: The keeper carried",
    "def add(a, b):\n    return a + b\n\n\ndef add_three(a, b, c):\n    return a + b + c\n\n\ndef add_four(",
)
FREE = ("Once upon a time, in a small village,", "The three primary colors are")
NEW = 48


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("fp32")


def _config(model_dir: Path, speculate: str) -> Config:
    return server_config(model_dir, max_sessions=2, capacity=1024, speculate=speculate)


@pytest.fixture(scope="module")
def servers(model_dir: Path) -> Iterator[tuple[RunningServer, RunningServer]]:
    with RunningServer(_config(model_dir, "lookup")) as on, RunningServer(_config(model_dir, "off")) as off:
        yield on, off


def _generate(server: RunningServer, text: str, **fields: object) -> pb.Completion:
    stopping = fields.pop("stopping", pb.StoppingOptions(max_new_tokens=NEW, ignore_eos=True))
    return server.stub.Generate(pb.GenerateRequest(prompt=pb.Prompt(text=text), stopping=stopping, **fields))


def _speculated(server: RunningServer) -> tuple[int, int]:
    decode = server.stats().decode
    return decode.verify_forwards, decode.accepted_tokens


def test_greedy_output_with_speculation_is_the_output_without_it(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    before = _speculated(on)
    for text in (*GROUNDED, *FREE):
        assert list(_generate(on, text).token_ids) == list(_generate(off, text).token_ids), text
    forwards, accepted = (a - b for a, b in zip(_speculated(on), before, strict=True))
    assert forwards > 0 and accepted > forwards  # the grounded prompts' drafts were kept
    assert _speculated(off) == (0, 0)


def test_a_seeded_sample_with_speculation_is_the_sample_without_it(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    sampling = pb.SamplingOptions(temperature=0.8, top_p=0.95, seed=11)
    for text in GROUNDED:
        got = _generate(on, text, sampling=sampling)
        assert list(got.token_ids) == list(_generate(off, text, sampling=sampling).token_ids), text


def test_stops_end_a_speculating_stream_where_they_end_a_plain_one(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    text = GROUNDED[0]
    plain = list(_generate(off, text).token_ids)
    for stopping in (
        pb.StoppingOptions(max_new_tokens=NEW, stop=["boats"]),
        pb.StoppingOptions(max_new_tokens=NEW, stop_token_ids=[plain[9]]),
        pb.StoppingOptions(max_new_tokens=NEW, stop=["tea"], min_new_tokens=3),
        pb.StoppingOptions(max_new_tokens=7, ignore_eos=True),
    ):
        got, want = _generate(on, text, stopping=stopping), _generate(off, text, stopping=stopping)
        assert (list(got.token_ids), got.text, got.finish_reason) == (
            list(want.token_ids),
            want.text,
            want.finish_reason,
        ), stopping


def test_log_probabilities_come_with_every_speculated_token(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    asked = pb.LogprobOptions(top=2)
    got, want = (_generate(s, GROUNDED[0], logprobs=asked) for s in (on, off))
    assert list(got.token_ids) == list(want.token_ids)
    assert [lp.id for lp in got.logprobs] == list(got.token_ids)
    for mine, theirs in zip(got.logprobs, want.logprobs, strict=True):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-3)
        assert [t.id for t in mine.top] == [t.id for t in theirs.top]


def _session_walk(server: RunningServer, ids: list[int]) -> list[object]:
    """A session prefilled, decoded in three calls (one stopped by a string), rewound and decoded
    again: everything the client sees."""
    session = prefill(server, part(ids, last=True))[-1].done.session_id
    seen: list[object] = []
    for stopping in (
        pb.StoppingOptions(max_new_tokens=12, ignore_eos=True),
        pb.StoppingOptions(max_new_tokens=NEW, stop=["notebook"]),  # hit mid-draft: the session rewinds
        pb.StoppingOptions(max_new_tokens=16, ignore_eos=True),
    ):
        events = list(server.stub.Decode(pb.DecodeRequest(session_id=session, stopping=stopping)))
        done = events[-1].done
        seen.append((list(done.token_ids), done.text, done.finish_reason, done.session_length))
    length = seen[0][3]  # type: ignore[index]
    server.stub.Rewind(pb.RewindRequest(session_id=session, length=length))
    events = list(
        server.stub.Decode(
            pb.DecodeRequest(
                session_id=session, stopping=pb.StoppingOptions(max_new_tokens=20, ignore_eos=True)
            )
        )
    )
    seen.append(list(events[-1].done.token_ids))
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    return seen


def test_a_session_speculated_holds_what_it_holds_without(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    ids = list(on.stub.Tokenize(pb.TokenizeRequest(text=GROUNDED[0])).ids)
    before = _speculated(on)
    assert _session_walk(on, ids) == _session_walk(off, ids)
    assert _speculated(on)[0] > before[0]


@pytest.mark.parametrize(
    ("speculate", "exact", "deterministic", "drafts"),
    [
        ("off", True, False, 0),
        ("lookup", False, False, 4),
        ("lookup", True, True, 0),
        ("auto", True, False, 4),
        ("auto", False, False, 0),
    ],
)
def test_speculation_is_on_as_configured_and_auto_only_where_verification_is_exact(
    speculate: str, exact: bool, deterministic: bool, drafts: int
) -> None:
    config = Config(speculate=speculate, deterministic=deterministic)
    assert config.speculation(exact) == drafts


SCHEMA = {
    "type": "object",
    "properties": {
        name: {"type": "integer"} if i % 3 == 0 else {"type": "string", "maxLength": 12}
        for i, name in enumerate(
            ("name", "city", "street", "number", "postcode", "country", "phone", "email", "floor", "notes")
        )
    },
    "required": [
        "name",
        "city",
        "street",
        "number",
        "postcode",
        "country",
        "phone",
        "email",
        "floor",
        "notes",
    ],
    "additionalProperties": False,
}


def test_tokens_a_json_schema_forces_cost_no_forward_of_their_own(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    constraint = pb.Constraint(json_schema=json.dumps(SCHEMA))
    stopping = pb.StoppingOptions(max_new_tokens=200)
    text = "Write the address of the lighthouse keeper as JSON."
    before = on.stats().decode
    got = _generate(on, text, constraint=constraint, stopping=stopping)
    after = on.stats().decode
    want = _generate(off, text, constraint=constraint, stopping=stopping)
    assert list(got.token_ids) == list(want.token_ids)
    assert set(json.loads(got.text)) == set(SCHEMA["properties"])  # type: ignore[call-overload]
    forwards = (after.steps - before.steps) + (after.verify_forwards - before.verify_forwards)
    assert forwards / len(got.token_ids) < 1  # forced keys, quotes and braces ride along


def test_a_request_that_opts_out_never_drafts_and_gets_the_same_tokens(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    ids = list(on.stub.Tokenize(pb.TokenizeRequest(text=GROUNDED[0])).ids)
    before = _speculated(on)
    got = _generate(on, GROUNDED[0], speculate=False)
    session = prefill(on, part(ids, last=True))[-1].done.session_id
    stopping = pb.StoppingOptions(max_new_tokens=24, ignore_eos=True)
    decoded = list(on.stub.Decode(pb.DecodeRequest(session_id=session, stopping=stopping, speculate=False)))
    on.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    assert _speculated(on) == before
    assert list(got.token_ids) == list(_generate(off, GROUNDED[0]).token_ids)
    assert list(decoded[-1].done.token_ids) == list(got.token_ids)[:24]


def test_the_openai_api_takes_speculate_as_an_extra_field() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert openai_call(body, chat=True, served=["m"]).generates[0].speculate
    assert not openai_call({**body, "speculate": False}, chat=True, served=["m"]).generates[0].speculate
    with pytest.raises(InvalidInput, match="speculate"):
        openai_call({**body, "speculate": "no"}, chat=True, served=["m"])


def test_a_fork_of_a_speculated_session_continues_as_without_speculation(
    servers: tuple[RunningServer, RunningServer],
) -> None:
    on, off = servers
    ids = list(on.stub.Tokenize(pb.TokenizeRequest(text=GROUNDED[1])).ids)

    def walk(server: RunningServer) -> list[list[int]]:
        session = prefill(server, part(ids, last=True))[-1].done.session_id
        stopping = pb.StoppingOptions(max_new_tokens=20, ignore_eos=True)
        first = list(server.stub.Decode(pb.DecodeRequest(session_id=session, stopping=stopping)))
        fork = server.stub.ForkSession(pb.ForkSessionRequest(session_id=session, length=len(ids) + 8))
        seen = [list(first[-1].done.token_ids)]
        for sid in (fork.session_id, session):
            events = list(server.stub.Decode(pb.DecodeRequest(session_id=sid, stopping=stopping)))
            seen.append(list(events[-1].done.token_ids))
            server.stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
        return seen

    assert walk(on) == walk(off)


def test_engine_stats_report_the_gap_that_decides_auto(servers: tuple[RunningServer, RunningServer]) -> None:
    on, off = servers
    assert on.stats().exactness.HasField("verify_gap") and on.stats().exactness.verify_gap < 1e-3
    assert not off.stats().exactness.HasField("verify_gap")  # --speculate off: not probed


def test_a_stream_beside_other_rows_looks_nothing_up_and_drafts_as_before_once_alone() -> None:
    # Beside other decoding rows a draft would run as a plain row: the stream neither proposes nor
    # indexes the tokens it chose (the worker's per-token cost at 64 rows), and once alone it drafts
    # exactly what a stream that had indexed every token drafts.
    lone = [False]
    stopping = Stopping(max_new_tokens=64)

    def speculation(alone: Callable[[], bool]) -> Speculation:
        return Speculation([1, 2, 3, 4], Sampler(SamplingParams()), stopping, 4, frozenset(), Costs(), alone)

    busy, always = speculation(lambda: lone[0]), speculation(lambda: True)
    for token in (1, 2, 3, 4, 5, 6, 1, 2):
        assert busy.draft(room=8, emitted=1) == ()
        always.draft(room=8, emitted=1)
        busy.chose(token)
        always.chose(token)
    assert busy.lookup.tokens == [1, 2, 3, 4], "nothing indexed while the stream had company"
    lone[0] = True
    assert busy.draft(room=8, emitted=1) == always.draft(room=8, emitted=1) != ()
    assert busy.lookup.tokens == always.lookup.tokens
