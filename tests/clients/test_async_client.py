"""The asyncio client against a real server: the same answers as the blocking client, streamed prefill."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from clients.python import AsyncLadderClient, LadderClient
from clients.python.messages import PromptInput
from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import PROMPT_IDS, greedy_stopping
from tests.support.servers import RunningServer
from tests.support.waiting import WAIT_S


async def _collect(events: AsyncIterator[pb.TokenEvent]) -> tuple[list[int], pb.Completion]:
    ids: list[int] = []
    async for event in events:
        if event.WhichOneof("event") == "done":
            return ids, event.done
        ids.append(event.token.id)
    raise AssertionError("the stream ended without a Completion")


def test_async_generate_gives_the_same_tokens_as_the_sync_client(
    server: RunningServer, client: LadderClient
) -> None:
    async def run() -> tuple[pb.Completion, list[int], pb.Completion]:
        async with AsyncLadderClient(server.address) as aclient:
            unary = await aclient.generate("async and sync agree", stopping=greedy_stopping(10))
            streamed = aclient.generate_stream("async and sync agree", stopping=greedy_stopping(10))
            ids, done = await _collect(streamed)
            return unary, ids, done

    unary, streamed_ids, done = asyncio.run(run())
    expected = client.generate("async and sync agree", stopping=greedy_stopping(10))
    assert list(unary.token_ids) == list(expected.token_ids) == streamed_ids == list(done.token_ids)
    assert unary.text == expected.text


def test_async_prefill_sends_parts_as_they_are_produced_then_decode_equals_generate(
    server: RunningServer, client: LadderClient
) -> None:
    def prefill_rounds() -> int:  # the last round that ran a prefill forward (the log keeps the latest)
        return max((r.round for r in server.steps() if r.prefill), default=0)

    async def parts() -> AsyncIterator[PromptInput]:
        # Parts trickle in, as from a client still reading its input: the next is produced only
        # once the server has run a forward of this one (a client that held them back would hang).
        for start in range(0, len(PROMPT_IDS), 30):
            before = prefill_rounds()
            yield PROMPT_IDS[start : start + 30]
            deadline = time.monotonic() + WAIT_S
            while prefill_rounds() == before:
                assert time.monotonic() < deadline, "the part was not sent as it was produced"
                await asyncio.sleep(0.005)

    async def run() -> tuple[list[pb.ForwardEvent], pb.PrefillDone, pb.Completion, pb.EngineStats]:
        async with AsyncLadderClient(server.address) as aclient:
            forwards, done = await aclient.prefill(parts())
            _, decoded = await _collect(aclient.decode(done.session_id, 8, stopping=greedy_stopping(8)))
            await aclient.close_session(done.session_id)
            return forwards, done, decoded, await aclient.engine_stats()

    forwards, done, decoded, stats = asyncio.run(run())
    # Rows copied from a prefix an earlier test left in this shared server count as prompt too.
    assert done.length == len(PROMPT_IDS) == sum(f.real_rows for f in forwards) + done.summary.shared_rows
    assert len(forwards) >= 4  # four parts, each run as soon as it arrived
    assert list(decoded.token_ids) == list(client.generate(PROMPT_IDS, stopping=greedy_stopping(8)).token_ids)
    assert stats.sessions_open == 0


def test_async_rewind_then_decode_reproduces_the_earlier_continuation(server: RunningServer) -> None:
    async def run() -> tuple[list[int], list[int]]:
        async with AsyncLadderClient(server.address) as aclient:
            _, done = await aclient.prefill([PROMPT_IDS[:50]])
            first, _ = await _collect(aclient.decode(done.session_id, 5, stopping=greedy_stopping(5)))
            await aclient.rewind(done.session_id, 50)
            again, _ = await _collect(aclient.decode(done.session_id, 5, stopping=greedy_stopping(5)))
            await aclient.close_session(done.session_id)
            return first, again

    first, again = asyncio.run(run())
    assert first == again and len(first) == 5


def test_async_health_model_info_and_errors(server: RunningServer) -> None:
    async def run() -> tuple[str, pb.ModelInfo, grpc.StatusCode]:
        async with AsyncLadderClient(server.address) as aclient:
            status = await aclient.health()
            info = await aclient.model_info()
            try:
                await aclient.rewind("no-such-pod.0123456789abcdef", 1)
            except grpc.aio.AioRpcError as error:
                return status, info, error.code()
            raise AssertionError("rewinding an unknown session succeeded")

    status, info, code = asyncio.run(run())
    assert status == "SERVING" and info.vocab_size == 512
    assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def test_async_wait_until_serving_reports_an_unreachable_server() -> None:
    async def run() -> str:
        async with AsyncLadderClient("127.0.0.1:1") as aclient:
            return await aclient.wait_until_serving(0.5)

    assert asyncio.run(run()) == "UNREACHABLE"
