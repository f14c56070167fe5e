"""The client-side CLI commands: each builds a LadderClient from the flags and makes a few calls."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from clients.python.channel import Connection
from clients.python.chat import ChatSession, ReplyStopped, echo_text
from clients.python.messages import Constraint, PromptInput, Sampling, Stopping, Turn, completion_of
from clients.python.sync_client import LadderClient
from clients.python.terminal import ChatTerminal
from proto.ladder.v1 import ladder_pb2 as pb


def connection_of(args: argparse.Namespace) -> Connection:
    token = args.token_file.read_text().strip() if args.token_file else args.token
    return Connection(
        address=args.address,
        tls=args.tls,
        root_certificate=args.ca,
        client_certificate=args.cert,
        client_key=args.key,
        server_name_override=args.server_name,
        token=token,
        timeout_s=args.timeout,
    )


def sampling_of(args: argparse.Namespace) -> Sampling:
    return Sampling(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
    )


def stopping_of(args: argparse.Namespace) -> Stopping:
    return Stopping(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), ignore_eos=args.ignore_eos)


def constraint_of(args: argparse.Namespace) -> Constraint | None:
    """--json-schema, --regex, --choice or --grammar (argparse lets through at most one)."""
    if args.json_schema is not None:
        return Constraint(json_schema=_file_or_text(args.json_schema))
    if args.regex is not None:
        return Constraint(regex=args.regex)
    if args.choice is not None:
        return Constraint(choice=tuple(args.choice.split(",")))
    if args.grammar is not None:
        return Constraint(grammar=_file_or_text(args.grammar))
    return None


def _file_or_text(value: str) -> str:
    """The file's text when `value` names a file, else `value` itself (inline JSON or GBNF)."""
    try:
        return Path(value).read_text() if Path(value).is_file() else value
    except OSError:  # a long inline text is no file name
        return value


def prompt_of(args: argparse.Namespace) -> PromptInput:
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.tokens:
        return [int(t) for t in text.split()]
    if args.chat:
        system = [Turn("system", args.system)] if args.system else []
        return [*system, Turn("user", text)]
    return text


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def generate(args: argparse.Namespace) -> int:
    with LadderClient(connection_of(args)) as client:
        events = client.generate_stream(
            prompt_of(args),
            sampling=sampling_of(args),
            stopping=stopping_of(args),
            constraint=constraint_of(args),
        )
        if args.ids:
            completion = completion_of(events)
            _write(" ".join(str(i) for i in completion.token_ids))
        else:
            completion = completion_of(echo_text(events, _write))
        _write("\n")
    if args.usage:
        print(usage_line(completion), file=sys.stderr)
    return 0


def usage_line(completion: pb.Completion) -> str:
    plan = completion.prefill
    finish = pb.FinishReason.Name(completion.finish_reason).removeprefix("FINISH_REASON_").lower()
    return (
        f"finish={finish} prompt_tokens={completion.usage.prompt_tokens} "
        f"completion_tokens={completion.usage.completion_tokens} ttft_ms={completion.timing.ttft_ms:.1f} "
        f"total_ms={completion.timing.total_ms:.1f} prefill_forwards={plan.forwards} "
        f"real_rows={plan.real_rows} padded_rows={plan.padded_rows} widths={list(plan.widths)}"
    )


def chat(args: argparse.Namespace) -> int:
    """Ctrl-C stops the reply and the chat goes on; Ctrl-D, end of input or Ctrl-C at the prompt ends it."""
    terminal = ChatTerminal()
    with LadderClient(connection_of(args)) as client:
        session = ChatSession(
            client,
            system=args.system,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling_of(args),
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
        print(
            "ladder chat: Ctrl-C stops a reply; Ctrl-D or Ctrl-C at the prompt ends the chat", file=sys.stderr
        )
        try:
            while (question := terminal.read_question()) is not None:
                _answer(session, terminal, question)
        except KeyboardInterrupt:
            terminal.write("\n")
        finally:
            session.close()
    return 0


def _answer(session: ChatSession, terminal: ChatTerminal, question: str) -> None:
    with terminal.reply() as show:
        try:
            session.ask(question, on_text=show)
        except ReplyStopped:
            terminal.stopped()


def stats(args: argparse.Namespace) -> int:
    with LadderClient(connection_of(args)) as client:
        doc = {"model": _as_dict(client.model_info()), "engine": _as_dict(client.engine_stats())}
    print(json.dumps(doc, indent=2))
    return 0


def _as_dict(message: pb.ModelInfo | pb.EngineStats) -> dict[str, object]:
    return MessageToDict(message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True)


def health(args: argparse.Namespace) -> int:
    with LadderClient(connection_of(args)) as client:
        status = _wait_for_serving(client, args.wait, args.watch_pid)
    print(status)
    return 0 if status == "SERVING" else 1


def _wait_for_serving(client: LadderClient, wait_s: float, watch_pid: int | None) -> str:
    """Poll in short rounds so a watched server that died ends the wait at once."""
    deadline = time.monotonic() + wait_s
    while True:
        status = client.wait_until_serving(min(2.0, max(0.0, deadline - time.monotonic())))
        if status == "SERVING" or time.monotonic() >= deadline:
            return status
        if watch_pid is not None and not _alive(watch_pid):
            return f"{status} (process {watch_pid} exited)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
