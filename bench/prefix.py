"""Prefix reuse through the real service: `python -m service` on a free port, driven over gRPC.

For each chunk width asked for, one server with prefix sharing on and one with it off
(`--prefix-sharing false`), both up at once:
- a shared system prompt (2,000 tokens) + distinct user turns (100 tokens): TTFT of
  GenerateStream, client side and the server's own `timing.ttft_ms`, each request sent to
  both servers in turn (the order alternating), so load on the machine falls on both alike;
  the greedy tokens of both servers compared;
- multi-turn: a chat kept in a live session (Prefill a user turn, Decode a reply, ten
  times); the 10th turn's TTFT (Prefill to PrefillDone, whose next_token is the first
  token) against the whole conversation resent as a fresh GenerateStream (sent just
  before the 10th turn is appended: with sharing on it can share turns 1-9);
- fork of a 4,000-token session: ForkSession's `server_ms` (worker time) and round trip;
  and, with the engine alone after the servers, the fork with the device copy waited for.

    python -m bench.prefix --provider cpu --model default --chunk-sizes 512,128 \
        --cache .pytest_cache/d/ladder-default-model --out bench/results/prefix-2026-11-30
    python -m bench.prefix --provider cuda --model gpu:16x2048 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import served
from bench.served import (
    free_port,
    machine,
    prompt,
    resolve_model,
    server_arguments,
    stub,
    vocab_of,
    wait_serving,
)
from proto.ladder.v1 import ladder_pb2 as pb


def start_server(args: argparse.Namespace, model: str, port: int, chunk: int, sharing: bool) -> Any:
    return served.start_server(
        args,
        model,
        port,
        "--max-sessions",
        str(args.slots),
        "--capacity",
        str(args.capacity),
        "--max-new-tokens",
        str(args.capacity),
        "--chunk-size",
        str(chunk),
        "--prefix-sharing",
        "true" if sharing else "false",
        *args.server_args.split(),
    )


def request(tokens: list[int], new: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)),
        stopping=pb.StoppingOptions(max_new_tokens=new, ignore_eos=True),
    )


def stream(client: Any, tokens: list[int], new: int) -> dict[str, Any]:
    """One GenerateStream: client TTFT, the server's TTFT, tokens, rows shared and prefilled."""
    start = time.perf_counter()
    ids, first, done = [], None, None
    for event in client.GenerateStream(request(tokens, new)):
        if event.HasField("token"):
            first = first or time.perf_counter()
            ids.append(event.token.id)
        else:
            done = event.done
    assert first is not None and done is not None
    return {
        "ttft_ms": (first - start) * 1e3,
        "server_ttft_ms": done.timing.ttft_ms,
        "ids": ids,
        "shared_rows": done.prefill.shared_rows,
        "prefilled_rows": done.prefill.real_rows,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ttft_ms_median": statistics.median(r["ttft_ms"] for r in rows),
        "server_ttft_ms_median": statistics.median(r["server_ttft_ms"] for r in rows),
        "ttft_ms": [round(r["ttft_ms"], 1) for r in rows],
        "shared_rows": [r["shared_rows"] for r in rows],
        "prefilled_rows": [r["prefilled_rows"] for r in rows],
    }


def system_prompts(clients: dict[str, Any], args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """A shared system prompt + distinct user turns, the same sequence to every server; one warm-up
    request each first. `--order alternate`: each request to every server in turn (the order
    alternating), so both see the same machine, and each server waits idle while the other answers.
    `--order blocks`: runs of `--block` requests back to back to one server (as under steady traffic),
    the servers' runs alternating A B B A ..."""
    system = prompt(args.system, 1, vocab)
    for client in clients.values():
        stream(client, system + prompt(args.user, 99, vocab), 2)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
    turns = [system + prompt(args.user, 100 + i, vocab) for i in range(args.requests)]
    names = list(clients)
    if args.order == "blocks":
        for b, first in enumerate(range(0, args.requests, args.block)):
            for name in names[:: 1 if b % 2 == 0 else -1]:
                rows[name] += [stream(clients[name], t, args.new) for t in turns[first : first + args.block]]
    else:
        for i, tokens in enumerate(turns):
            for name in names[:: 1 if i % 2 == 0 else -1]:
                rows[name].append(stream(clients[name], tokens, args.new))
    return {name: {**summary(r), "tokens": [x["ids"] for x in r]} for name, r in rows.items()}


def prefill(client: Any, tokens: list[int], session_id: str = "") -> tuple[pb.PrefillDone, float]:
    part = pb.PrefillRequest(
        session_id=session_id, prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)), last=True
    )
    start = time.perf_counter()
    events = list(client.Prefill(iter([part])))
    return events[-1].done, (time.perf_counter() - start) * 1e3


def decode(client: Any, session_id: str, n: int) -> list[int]:
    stopping = pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
    call = pb.DecodeRequest(session_id=session_id, stopping=stopping)
    return [e.token.id for e in client.Decode(call) if e.HasField("token")]


def multi_turn(client: Any, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """Ten turns in a live session; the 10th turn's TTFT against the conversation resent whole.

    The resends run before the 10th turn is appended, so with sharing on what they can share
    is what the live session holds then (turns 1-9), as for a client that resends instead."""
    conversation: list[int] = []
    session_id, turn_ms = "", []
    for turn in range(args.chat_turns):
        user = prompt(args.user, 500 + turn, vocab)
        if turn + 1 == args.chat_turns:
            resent = [stream(client, conversation + user, 1) for _ in range(3)]
        done, ms = prefill(client, user, session_id)
        session_id, conversation = done.session_id, conversation + user
        turn_ms.append(ms)
        if turn + 1 < args.chat_turns:
            conversation += decode(client, session_id, args.reply)
    client.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    return {
        "conversation_tokens": len(conversation),
        "turn_ttft_ms": [round(m, 1) for m in turn_ms],
        "append_ttft_ms": turn_ms[-1],
        "resend": summary(resent),
        "append_next_token": done.next_token,
        "resend_first_tokens": [r["ids"][0] for r in resent],
        "append_over_resend": turn_ms[-1] / statistics.median(r["ttft_ms"] for r in resent),
    }


def fork_timing(client: Any, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    done, prefill_ms = prefill(client, prompt(args.fork_length, 7, vocab))
    server, trip = [], []
    for _ in range(args.forks):
        start = time.perf_counter()
        forked = client.ForkSession(pb.ForkSessionRequest(session_id=done.session_id))
        trip.append((time.perf_counter() - start) * 1e3)
        server.append(forked.server_ms)
        client.CloseSession(pb.CloseSessionRequest(session_id=forked.session_id))
    client.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))
    return {
        "length": done.length,
        "prefill_ms": prefill_ms,
        "server_ms": server,
        "server_ms_median": statistics.median(server),
        "round_trip_ms_median": statistics.median(trip),
    }


def engine_fork(model: Path, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """The engine alone: fork a long session, the device copy waited for (CUDA: the stream synchronized)."""
    from engine.executor import EngineOptions
    from engine.executor.engine import Engine

    engine = Engine.load(model, EngineOptions(provider=args.provider, capacity=args.capacity, max_sessions=2))
    source = engine.open_session()
    engine.append(source, prompt(args.fork_length, 7, vocab))
    runtime = getattr(engine.backend, "rt", None)
    times = []
    for _ in range(args.forks):
        start = time.perf_counter()
        forked = engine.fork(source)
        if runtime is not None:
            runtime.wait_queue()
        times.append((time.perf_counter() - start) * 1e3)
        engine.close_session(forked, keep=False)
    engine.close()
    return {
        "length": args.fork_length,
        "fork_ms": times,
        "fork_ms_median": statistics.median(times),
        "provider": engine.backend.name,
    }


def both_servers(args: argparse.Namespace, model: str, vocab: int, chunk: int) -> dict[str, Any]:
    """The servers with sharing on and off, up at once: the system-prompt requests alternate between
    them; then each runs the chat, and the sharing one the forks."""
    ports = {"sharing_on": free_port(), "sharing_off": free_port()}
    while ports["sharing_off"] == ports["sharing_on"]:
        ports["sharing_off"] = free_port()
    servers = {
        name: start_server(args, model, port, chunk, name == "sharing_on") for name, port in ports.items()
    }
    out: dict[str, dict[str, Any]] = {name: {} for name in servers}
    try:
        clients = {}
        for name, port in ports.items():
            wait_serving(f"127.0.0.1:{port}")
            clients[name] = stub(f"127.0.0.1:{port}")
        for name, measured in system_prompts(clients, args, vocab).items():
            out[name]["system_prompt"] = measured
        for name, client in clients.items():
            out[name]["multi_turn"] = multi_turn(client, args, vocab)
        out["sharing_on"]["fork"] = fork_timing(clients["sharing_on"], args, vocab)
        for name, client in clients.items():
            stats = client.GetEngineStats(pb.GetEngineStatsRequest()).prefix
            out[name]["prefix_stats"] = {
                "hits": stats.hits,
                "tokens_saved": stats.tokens_saved,
                "forks": stats.forks,
                "slots_held": stats.slots_held,
                "bytes_held": stats.bytes_held,
                "evictions": stats.evictions,
            }
    finally:
        for name, server in servers.items():
            server.terminate()
            out[name]["server_exit_code"] = server.wait(120)
    return out


def compare(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    system_on, system_off = on["system_prompt"], off["system_prompt"]
    return {
        "system_prompt_ttft_ratio": system_on["ttft_ms_median"] / system_off["ttft_ms_median"],
        "system_prompt_server_ttft_ratio": system_on["server_ttft_ms_median"]
        / system_off["server_ttft_ms_median"],
        "greedy_tokens_equal": system_on["tokens"] == system_off["tokens"],
        "requests_with_equal_tokens": sum(
            a == b for a, b in zip(system_on["tokens"], system_off["tokens"], strict=True)
        ),
        "tenth_turn_append_over_resend_without_sharing": off["multi_turn"]["append_over_resend"],
        "tenth_turn_append_over_resend_with_sharing": on["multi_turn"]["append_over_resend"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, provider="cuda", model="gpu:16x2048", precision="fp32")
    parser.add_argument("--chunk-sizes", default="512", help="comma-separated chunk widths to serve with")
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--system", type=int, default=2000)
    parser.add_argument("--user", type=int, default=100)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--chat-turns", type=int, default=10)
    parser.add_argument("--reply", type=int, default=32)
    parser.add_argument("--fork-length", type=int, default=4000)
    parser.add_argument("--forks", type=int, default=5)
    parser.add_argument(
        "--order",
        choices=("alternate", "blocks"),
        default="alternate",
        help="how the system-prompt requests go to the two servers (see system_prompts)",
    )
    parser.add_argument("--block", type=int, default=5, help="requests per run with --order blocks")
    parser.add_argument("--skip", default="", help="comma-separated: engine")
    parser.add_argument("--server-args", default="", help="more flags for the servers")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    vocab = vocab_of(model)
    result: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "model": model,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "chunks": {},
    }
    for chunk in (int(c) for c in args.chunk_sizes.split(",")):
        both = both_servers(args, model, vocab, chunk)
        on, off = both["sharing_on"], both["sharing_off"]
        result["chunks"][str(chunk)] = {"compare": compare(on, off), "sharing_on": on, "sharing_off": off}
        print(json.dumps(result["chunks"][str(chunk)]["compare"]), flush=True)
    if "engine" not in args.skip.split(","):
        result["engine_fork"] = engine_fork(Path(model), args, vocab)
    (args.out / "prefix.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
