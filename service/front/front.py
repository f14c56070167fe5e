"""What a call's side of the server holds (Front): the config, the model as calls see it, the metrics
of calls, and the core its orders go to. The servicer and the HTTP app work on a Front only, so
they run alike in the server's process and in a frontend process (service/processes/frontend.py): there the
model view is built from what the core said at start-up and the core is reached over a socket.

The rules a call meets before its order leaves: its prompt to token ids off the event loop, how
many samples the server can run at all, how the model writes tool calls, and the call's Progress.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from service.calls import Prompt
from service.config import Config
from service.core.orders import CoreApi
from service.core.serving import sample_limits
from service.door.call_context import CALL
from service.events import PrefillTally
from service.front.progress import Progress
from service.front.tool_formats import ToolFormat, format_for
from service.metrics import Metrics
from service.served_model import ModelView

# Tokenization's own threads (one set for the process): nothing else queued on them can make a
# prompt wait, as structured-output compiles once did on the event loop's executor (issue #39).
TOKENIZING = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ladder-tokenize")


def note_session(session_id: str) -> None:
    """Name the session in the call's access-log line."""
    record = CALL.get()
    if record is not None:
        record.session = session_id


@dataclass
class Front:
    """A call's side of the server: the config, the model view, the metrics calls feed, the core."""

    config: Config
    model: ModelView
    metrics: Metrics
    core: CoreApi

    async def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, tokenized off the event loop (its size was bounded first)."""
        if prompt.ids is not None:
            return self.model.prompt_ids(prompt)
        return await asyncio.get_running_loop().run_in_executor(TOKENIZING, self.model.prompt_ids, prompt)

    def tool_format(self) -> ToolFormat:
        """How the served model writes tool calls: --tool-call-format, else read from its chat template."""
        tokenizer = self.model.tokenizer
        template = tokenizer.chat_template if tokenizer is not None else None
        return format_for(template.source if template is not None else None, self.config.tool_call_format)

    def sample_limits(self, n: int) -> None:
        sample_limits(self.model.facts, n)

    def progress(self, prompt_tokens: int = 0) -> Progress:
        """The call's record of its generation, timed from the call's arrival, in its access-log line."""
        record = CALL.get()
        arrived = record.arrived if record is not None else time.perf_counter()
        method = record.method if record is not None else ""
        progress = Progress(arrived, prompt_tokens, PrefillTally(), self.metrics, method=method)
        if record is not None:
            record.add_progress(progress)
        return progress
