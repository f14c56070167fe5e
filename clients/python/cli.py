"""The `ladder` command: serve a model, prepare the default one, and talk to a server.

Thin by design: `serve` hands its flags to service.config and calls service.server.serve;
`model prepare` calls engine.default_model; every other command is a few calls
on `LadderClient`. Exit status 0 on success, 1 on an RPC failure (the status is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from clients.python.channel import DEFAULT_ADDRESS

Handler = Callable[[argparse.Namespace], int]


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--address", default=DEFAULT_ADDRESS, help="server host:port [%(default)s]")
    group.add_argument("--tls", action="store_true", help="use TLS (implied by --ca/--cert/--key)")
    group.add_argument("--ca", type=Path, help="root certificate(s) to trust (PEM)")
    group.add_argument("--cert", type=Path, help="client certificate for mutual TLS (PEM)")
    group.add_argument("--key", type=Path, help="client private key for mutual TLS (PEM)")
    group.add_argument("--server-name", help="expected server name in its certificate")
    group.add_argument("--token-file", type=Path, help="file holding the bearer token")
    group.add_argument("--token", help="bearer token (prefer --token-file: flags show in ps)")
    group.add_argument(
        "--timeout", type=float, default=300.0, help="deadline per call, seconds [%(default)s]"
    )


def add_sampling_flags(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    group = parser.add_argument_group("sampling and stopping")
    group.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="[%(default)s]")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy [%(default)s]")
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--top-p", type=float)
    group.add_argument("--repetition-penalty", type=float)
    group.add_argument("--min-p", type=float, default=0.0, help="0 = off [%(default)s]")
    group.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2] [%(default)s]")
    group.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2] [%(default)s]")
    group.add_argument("--seed", type=int)
    group.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
    group.add_argument("--ignore-eos", action="store_true")


def add_constraint_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("structured output (one of)").add_mutually_exclusive_group()
    group.add_argument("--json-schema", metavar="FILE|JSON", help="JSON valid against this schema")
    group.add_argument("--regex", help="text the regular expression (Python re syntax) matches whole")
    group.add_argument("--choice", metavar="A,B,...", help="one of these comma-separated options")
    group.add_argument("--grammar", metavar="FILE|GBNF", help="text this GBNF grammar (rule root) matches")


def build_parser() -> argparse.ArgumentParser:
    from clients.python import commands

    parser = argparse.ArgumentParser(prog="ladder", description="Ladder: serve and query ONNX decoder LMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_model(sub)
    gen = _client_command(sub, "generate", "complete a prompt, streaming the text", commands.generate)
    gen.add_argument("prompt", nargs="?", default="-", help='the prompt ("-" reads stdin)')
    gen.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    gen.add_argument("--system", help="system message (with --chat)")
    gen.add_argument("--tokens", action="store_true", help="the prompt is space-separated token ids")
    gen.add_argument("--ids", action="store_true", help="print generated token ids, not text")
    gen.add_argument(
        "--usage", action="store_true", help="print usage, timing and the prefill plan to stderr"
    )
    add_sampling_flags(gen, max_new_tokens=64)
    add_constraint_flags(gen)
    chat = _client_command(sub, "chat", "interactive chat on a server-side session", commands.chat)
    chat.add_argument("--system", help="system message")
    add_sampling_flags(chat, max_new_tokens=256)
    _client_command(sub, "stats", "print model info and engine stats as JSON", commands.stats)
    health = _client_command(sub, "health", "print the health status (exit 0 if SERVING)", commands.health)
    health.add_argument("--wait", type=float, default=0.0, help="seconds to wait for SERVING [%(default)s]")
    health.add_argument("--watch-pid", type=int, help="stop waiting if this process exits")
    return parser


def _client_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str, handler: Handler
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    add_connection_flags(parser)
    parser.set_defaults(handler=handler)
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Listed for `ladder --help` only: main() hands `serve` and its flags to service.config whole.
    sub.add_parser(
        "serve", help="serve a model over gRPC (`ladder serve --help` lists the flags)", add_help=False
    )


def _add_model(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    model = sub.add_parser("model", help="manage the default model")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    prepare = model_sub.add_parser("prepare", help="fetch and convert the default model; print its directory")
    prepare.add_argument("--model-cache", help="cache root (default: where `ladder serve` looks)")
    prepare.add_argument(
        "--model-precision",
        help="auto (int4; fp16 with LADDER_PROVIDER=cuda), int4, fp16 or fp32, as `ladder serve` takes it",
    )
    prepare.set_defaults(handler=run_prepare)


def run_serve(argv: Sequence[str]) -> int:
    """Flags and LADDER_* environment into the one Config (service.config), then serve until SIGTERM."""
    from service.entry import main

    return main(argv)


def run_prepare(args: argparse.Namespace) -> int:
    from engine.default_model import prepare, progress_on_stderr
    from service.config import load_config

    flags = ["--model-cache", args.model_cache] if args.model_cache else []
    flags += ["--model-precision", args.model_precision] if args.model_precision else []
    config = load_config(argv=flags)
    progress_on_stderr()
    start = time.perf_counter()
    result = prepare(Path(config.model_cache), precision=config.default_model_precision)
    verb = "built" if result.rebuilt else "reused"
    print(f"{verb} {result.model_dir} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(result.model_dir)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return run_serve(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except grpc.RpcError as error:
        print(f"ladder: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`ladder stats | head`): say nothing more, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
