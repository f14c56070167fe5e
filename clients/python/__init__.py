"""The Python client of Ladder: `LadderClient` (blocking), `AsyncLadderClient` (asyncio), the `ladder` CLI.

from clients.python import LadderClient, Stopping
with LadderClient("127.0.0.1:50051") as client:
    print(client.generate("The capital of France is", stopping=Stopping(max_new_tokens=16)).text)
"""

from clients.python.async_client import AsyncLadderClient
from clients.python.channel import Connection
from clients.python.chat import ChatSession
from clients.python.messages import (
    Constraint,
    Logprobs,
    Sampling,
    Stopping,
    Turn,
    completion_of,
    fork_session_id,
)
from clients.python.sync_client import LadderClient

__all__ = [
    "AsyncLadderClient",
    "ChatSession",
    "Connection",
    "Constraint",
    "LadderClient",
    "Logprobs",
    "Sampling",
    "Stopping",
    "Turn",
    "completion_of",
    "fork_session_id",
]
