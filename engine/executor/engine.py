"""The engine: one model, one backend, the KV slot pool, the variant cache, every forward.

It carries out the planner's decisions: a prefill runs one forward at a time
(plan -> widen -> run -> self-check -> rewind), and a decode step runs one
forward for every session in it, whatever their lengths, over the first B rows
of the pool (B on the batch ladder). Every token, the first included, is
chosen here, from the logits the backend keeps where it computed them. More
sessions than the pool has rows stay open by parking the idle ones off it (parking.py).

Not thread-safe by design: the service runs it on one worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from engine.errors import EngineFault, Exhausted
from engine.executor.decode import BatchDecoder
from engine.executor.decode_runner import DecodeRunner, drafts_verified
from engine.executor.exactness import KernelRules, assumed
from engine.executor.facts import EngineFacts
from engine.executor.invariants import bookkeeping_problems
from engine.executor.kernels import PROBE_ROWS, measure
from engine.executor.prefill import (
    ForwardReport,
)
from engine.executor.prefilling import Prefiller
from engine.executor.prefix import HeldPrefixes
from engine.executor.rows import SessionTable
from engine.executor.session import Session
from engine.executor.shape import engine_shape
from engine.executor.sizing import pool_rows, prompt_sizes, variant_reserve
from engine.executor.stats import (
    EngineStats,
    MemoryUse,
    ParkingStats,
    decode_stats,
    kv_position_bytes,
    kv_slot_bytes,
    model_file_bytes,
    variant_bytes_estimate,
)
from engine.executor.step import (
    DecodeRow,
    Open,
    Step,
    StepResult,
)
from engine.executor.stepping import run_step
from engine.executor.warmup import warm_up
from engine.head import prepared_graph
from engine.model import ModelInfo, load_model_info
from engine.options import EngineOptions
from engine.runtime.backend import Backend
from engine.runtime.cpu import CpuBackend, _dtype
from engine.runtime.variants import Variant, VariantCache, VariantKey

__all__ = [
    "DecodeRow",
    "Engine",
    "EngineStats",
    "MemoryUse",
    "Step",
    "StepResult",
    "kv_slot_bytes",
    "variant_bytes_estimate",
]
from engine.planner import (
    batch_widths,
    prefix_unit,
)
from engine.planner.drafts import VERIFY_WIDTHS, Costs

log = structlog.get_logger("ladder.engine")


def make_backend(info: ModelInfo, options: EngineOptions) -> Backend[Any]:
    """The backend for `options.provider`; "cuda" falls back to CPU, with a log line, when unusable."""
    if options.provider == "cuda":
        from engine.runtime.cuda import CudaBackend, CudaUnavailable  # imports cupy only when built

        try:
            return CudaBackend(info, options)
        except CudaUnavailable as exc:
            log.warning("cuda_unavailable_falling_back_to_cpu", reason=str(exc))
    return CpuBackend(info, options)


def load_engine(path: Path | str, options: EngineOptions | None = None) -> Engine:
    """The engine of the model at `path`, as service/loading.py builds it (the rest of the product
    drives it through engine.executor.step.Driven)."""
    return Engine.load(path, options)


class Engine:
    """One model on one backend, built of parts that each own their state: the geometry
    (`shape`, shape.py), the session table (`table`, rows.py), the prefill runner (`prefiller`,
    prefilling.py), the batch decoder (`decoder`, decode.py) and the decode runner (`runner`,
    decode_runner.py), beside the pool, the variant cache and the held prefixes. The engine holds
    the parts, hands each what it uses, and carries out a step with them; the parts' operations
    are its own (plain delegation)."""

    def __init__(self, info: ModelInfo, options: EngineOptions, backend: Backend[Any]) -> None:
        self.shape = engine_shape(info, options)
        self.info, self.options, self.backend = info, options, backend
        self.limits, self.capacity, self.chunk_size = (
            self.shape.limits,
            self.shape.capacity,
            self.shape.chunk_size,
        )
        self.ladder, self.padded_ladder = self.shape.ladder, self.shape.padded_ladder
        self.feed_dtype, self.port_dtypes = self.shape.feed_dtype, self.shape.port_dtypes
        self.unbatched_reason = self.shape.unbatched_reason
        self.slot_bytes = kv_slot_bytes(info, self.capacity)
        self.weights_bytes = backend.weights_bytes or model_file_bytes(info)
        self._prompts_batchable = not (options.deterministic or not info.logits_rows or self.unbatched_reason)
        rows = self._pool_rows()
        self.batch_widths = () if self.unbatched_reason else batch_widths(rows)
        self.prompt_sizes = self._prompt_sizes(rows)
        prompt_shapes = len(self.padded_ladder) * len(self.prompt_sizes)
        verify_shapes = len(VERIFY_WIDTHS) if drafts_verified(self.shape) else 0
        wanted = options.variant_capacity or (
            len(self.ladder) + max(len(self.batch_widths), 1) + prompt_shapes + verify_shapes
        )
        self.variants: VariantCache[Any] = VariantCache(wanted, evictable=backend.evictable)
        self.pool = backend.allocate(rows, self.capacity)
        # The staging blocks the backend allocates beside the pool: counted with the variants binding them.
        self.staging_bytes = self._staging_row_bytes
        if self.prompt_sizes:
            self.staging_bytes += backend.allocate_prompts(max(self.prompt_sizes), max(self.padded_ladder))
        # Prefix reuse needs token ids, a ladder and KV a rewind can cut: no ports, no state.
        sharing = bool(options.prefix_sharing and self.chunk_size > 0 and not self.unbatched_reason)
        self.prefixes = HeldPrefixes(
            self.pool, backend, prefix_unit(self.chunk_size), sharing, kv_position_bytes(info)
        )
        self.eager_forwards = 0  # forwards run without a prepared variant (`_variant`)
        open_rows: dict[int, Session] = {}  # pool row -> the session whose KV it holds (the table's)
        self.decoder = BatchDecoder(self.pool, backend, self._variant, open_rows, self.capacity)
        self.table = SessionTable(
            info, backend, self.pool, self.prefixes, self.decoder, open_rows, self.chunk_size
        )
        self.prefiller = Prefiller(
            self.shape,
            backend,
            self.pool,
            self.decoder,
            self.prefixes,
            self._variant,
            self.prompt_sizes,
            assumed(backend.rows_follow_width),
            self.table.check_open,
        )
        # The parts' operations, the engine's own: their docstrings say what each does.
        self.close_session = self.table.close_session
        self.copy_session = self.table.copy_session
        self.compact = self.table.compact
        self.park = self.table.park
        self.begin_step = self.table.begin_step
        self.end_step = self.table.end_step
        self.plan = self.prefiller.plan
        self.start_prefill = self.prefiller.start_prefill
        self.prefill_step = self.prefiller.prefill_step
        self.prompt_width = self.prefiller.prompt_width
        self.prefill_prompts = self.prefiller.prefill_prompts
        self.warm_prompts = self.prefiller.warm_prompts
        self.restore = self.prefiller.restore
        self.rewind = self.prefiller.rewind
        self.reset_to = self.prefiller.reset_to
        self.verify_forward = self.prefiller.verify_forward
        self.facts = EngineFacts(
            provider=backend.name,
            capacity=self.capacity,
            chunk_size=self.chunk_size,
            ladder=self.padded_ladder,
            slots=rows,
            batch_widths=self.batch_widths,
            variant_capacity=self.variants.capacity,
            padding=bool(options.padding and not info.recurrent_state),
            recurrent=info.recurrent_state,
            token_ids_only=info.feed.name == "input_ids" and not info.supplied_ports,
            unbatched_reason=self.unbatched_reason,
            vocab_size=info.vocab_size,
            eos_ids=tuple(info.eos_token_ids),
            bos_id=info.bos_token_id,
            layers=info.num_layers,
            prompt_batch=max(self.prompt_sizes, default=1),
        )
        self.runner = DecodeRunner(
            self.shape, backend, self.decoder, self.table, self.prefiller, self.facts.token_ids_only
        )
        self.check_decode = self.runner.check_decode
        self.decode = self.runner.decode
        self.decode_checked = self.runner.decode_checked
        self.verify = self.runner.verify
        self.choose = self.runner.choose
        self.choose_rows = self.runner.choose_rows
        self.check_choose = self.runner.check_choose
        self.logits = self.runner.logits

    @classmethod
    def load(cls, path: Path | str, options: EngineOptions | None = None) -> Engine:
        options = options or EngineOptions()
        # CUDA gathers the read rows in a form a CUDA graph captures (engine/head.py).
        info = prepared_graph(
            load_model_info(Path(path)),
            options.graph_cache_dir,
            options.graph_read_only,
            on_device=options.provider == "cuda",
        )
        engine = cls(info, options, make_backend(info, options))
        if engine.backend.name == "cpu" and not engine.unbatched_reason and engine.capacity > PROBE_ROWS:
            engine.follow(measure(engine))
        log.info(
            "kernel_rules",
            restore_rule=engine.kernels.restore_rule,
            measured=engine.kernels.measured,
            least_decode_batch=engine.kernels.least_decode_batch,
            one_row_gap=engine.kernels.one_row_gap,
            re_run_gap=engine.kernels.re_run_gap,
            verify_gap=engine.kernels.verify_gap,
        )
        log.info(
            "engine_loaded",
            model=str(path),
            provider=engine.backend.name,
            capacity=engine.capacity,
            chunk=engine.chunk_size,
            ladder=engine.ladder,
            slots=engine.pool.rows,
            batch_widths=engine.batch_widths,
            padding=options.padding,
            recurrent=info.recurrent_state,
            head_rows="read" if info.logits_rows else "every",
        )
        return engine

    def follow(self, rules: KernelRules) -> None:
        """Take the exactness rules measured on this machine (engine/executor/kernels.py): decode
        forwards no narrower than `least_decode_batch` rows (when the pool has them)."""
        self.prefiller.kernels = rules
        least = rules.least_decode_batch if self.pool.rows >= rules.least_decode_batch else 1
        if not self.unbatched_reason:
            self.batch_widths = tuple(w for w in batch_widths(self.pool.rows) if w >= least)
        self.decoder.least = least
        self.facts = replace(self.facts, batch_widths=self.batch_widths)

    # -- the parts' state, read through the engine ----------------------------------------------
    @property
    def kernels(self) -> KernelRules:
        """The exactness rules this machine's kernels allow (kernels.py; the prefill runner's)."""
        return self.prefiller.kernels

    @property
    def fresh_forwards(self) -> bool:
        return self.prefiller.fresh_forwards

    @property
    def shared_span(self) -> int:
        return self.prefiller.shared_span

    @property
    def sessions_padding_off(self) -> int:
        return self.prefiller.sessions_padding_off

    @sessions_padding_off.setter
    def sessions_padding_off(self, count: int) -> None:  # the load-time probe puts it back (kernels.py)
        self.prefiller.sessions_padding_off = count

    @property
    def prompt_forwards(self) -> int:
        return self.prefiller.prompt_forwards

    @property
    def prompts_batched(self) -> int:
        return self.prefiller.prompts_batched

    @property
    def free_slots(self) -> int:
        return self.table.free_slots

    @property
    def free_rows(self) -> set[int]:
        """The pool rows no session holds (a held prefix may sit on one)."""
        return self.table.free

    @property
    def rows_held(self) -> int:
        return self.table.rows_held

    @property
    def sessions_open(self) -> int:
        return self.table.sessions_open

    @property
    def parked_bytes(self) -> int:
        return self.table.parked_bytes

    # -- sessions: the table's, with what needs the prefill runner ------------------------------
    def open_session(self, scope: str = "", prompt: Sequence[int] = ()) -> Session:
        """`SessionTable.open_session`, sharing prefixes as the kernel rules say (`fresh_forwards`)."""
        return self.table.open_session(scope, prompt, self.fresh_forwards)

    def share_prefix(self, session: Session, prompt: Sequence[int]) -> int:
        """`SessionTable.share_prefix`, sharing prefixes as the kernel rules say (`fresh_forwards`)."""
        return self.table.share_prefix(session, prompt, self.fresh_forwards)

    def fork(self, source: Session, length: int | None = None) -> Session:
        """A new session holding a copy of `source`'s first `length` tokens (default all), in the same
        scope; its next-token logits are those of the tokens it holds, as after a rewind."""
        length = source.length if length is None else length
        session = self.table.fork(source, length)
        if (
            length != source.length
            and length
            and len(session.tokens) == length
            and not self.info.supplied_ports
        ):
            self.prefiller.restore(session)
        return session

    # -- the pool -----------------------------------------------------------------------
    def _variant(self, key: VariantKey) -> Variant | None:
        """The prepared forward of a shape (the decoder's and the prefill runner's), from the cache."""
        variant = self.variants.get(key, self.backend.prepare)
        if variant is None:  # a backend that cannot release variants runs uncached shapes eagerly
            self.eager_forwards += 1
        return variant

    @property
    def _staging_row_bytes(self) -> int:
        return self.backend.staging_rows * self.capacity * kv_position_bytes(self.info)

    def _prompt_sizes(self, rows: int) -> tuple[int, ...]:
        return prompt_sizes(self.backend.prompt_batch, rows, self.padded_ladder, self._prompts_batchable)

    def _variant_reserve(self, rows: int) -> int:
        """Bytes beside weights and KV at `rows` slots: the planned variants and the staging they bind."""
        planned = variant_reserve(
            self.info,
            self.ladder,
            rows,
            batched=not self.unbatched_reason,
            prompts=self._prompt_sizes(rows),
            padded=self.padded_ladder,
        )
        return self._staging_row_bytes + planned

    def _pool_rows(self) -> int:
        """max_sessions rows, or as many as the memory budget holds beside weights and variants."""
        rows = pool_rows(
            self.options.max_sessions,
            self.options.memory_budget_bytes,
            self.weights_bytes,
            self.slot_bytes,
            self._variant_reserve,
        )
        if rows < self.options.max_sessions:
            log.warning("memory_budget_limits_sessions", slots=rows, max_sessions=self.options.max_sessions)
        return rows

    def memory(self) -> MemoryUse:
        return MemoryUse(
            weights=self.weights_bytes,
            kv=self.pool.rows * self.slot_bytes,
            variants=self.variants.stats().nbytes + self.staging_bytes,
            budget=self.options.memory_budget_bytes,
        )

    # -- the step: the one way a scheduler drives the engine ---------------------------------
    def before_forward(self, hook: Callable[[], None] | None) -> None:
        """Call `hook` just before each forward enters onnxruntime (Driven.before_forward)."""
        self.backend.before_forward = hook

    def step(self, step: Step) -> StepResult:
        """Run one round's work (engine/executor/stepping.py runs it, step.py says in what order);
        every item's outcome comes back, each item failing alone; the bookkeeping is checked after."""
        result = run_step(self, step)
        self.check_invariants()
        return result

    def open_sessions(self, request: Open) -> list[Session]:
        """The sessions of one `Open`: all of them or none (Exhausted)."""
        if request.count > self.free_slots:
            raise Exhausted(f"{request.count} sessions asked for, {self.free_slots} KV slots free")
        self.table.make_room(request.count)
        first = self.open_session(request.scope, request.prompt)
        return [first, *(self.open_session(request.scope) for _ in range(request.count - 1))]

    def check_invariants(self) -> None:
        """Raise EngineFault when the engine's bookkeeping no longer holds (run after every step;
        what is checked: engine/executor/invariants.py)."""
        table = self.table
        in_flight = bool(self.decoder.in_flight)
        problems = bookkeeping_problems(
            self.pool, self.prefixes.held, in_flight, table.open, table.free, table.parking
        )
        if problems:
            raise EngineFault("engine bookkeeping broke: " + "; ".join(problems))

    # -- decode: the decode runner's -------------------------------------------------------
    @property
    def verifies(self) -> bool:
        """Whether drafted rows are verified (decode_runner.py)."""
        return self.runner.verifies

    @property
    def costs(self) -> Costs:
        """What a lone stream's step and a verification forward take here (decode_runner.py)."""
        return self.runner.costs

    @property
    def last_batch(self) -> int:
        """The batch width of the last decode forward."""
        return self.decoder.counters.last_batch

    # -- warm-up --------------------------------------------------------------------------
    def warm_up(self) -> int:
        """Prepare every shape the engine plans before any request (engine/executor/warmup.py).
        Returns the variants prepared."""
        return warm_up(self)

    # -- conveniences (tests, benchmarks) ---------------------------------------------------
    def prefill(
        self,
        session: Session,
        tokens: Sequence[int] | None = None,
        *,
        embeds: np.ndarray | None = None,
        ports: Mapping[str, np.ndarray] | None = None,
    ) -> Iterator[ForwardReport]:
        task = self.start_prefill(session, tokens, embeds=embeds, ports=ports)
        while not task.done:
            yield self.prefill_step(task)

    def append(
        self,
        session: Session,
        tokens: Sequence[int] | None = None,
        *,
        embeds: np.ndarray | None = None,
        ports: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Append a prompt (or one token) and return a host copy of the next-token logits [vocab]."""
        for _ in self.prefill(session, tokens, embeds=embeds, ports=ports):
            pass
        return self.logits(session)

    # -- stats ------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return EngineStats(
            variants=self.variants.stats(),
            eager_forwards=self.eager_forwards,
            sessions_open=self.sessions_open,
            sessions_padding_off=self.sessions_padding_off,
            slots_allocated=self.pool.rows,
            slot_bytes=self.slot_bytes,
            memory=self.memory(),
            decode=decode_stats(self.decoder.counters),
            batch_widths=self.batch_widths,
            unbatched_reason=self.unbatched_reason,
            prefix=self.prefixes.stats(),
            parking=self.parking(),
            prompt_forwards=self.prompt_forwards,
            prompts_batched=self.prompts_batched,
            prompt_batch=max(self.prompt_sizes, default=1),
            kernels=self.kernels,
        )

    def parking(self) -> ParkingStats:
        return self.table.parking.stats()

    def limit_parked_on_device(self, nbytes: int | None) -> None:
        """Parked copies kept in device memory up to `nbytes`; past it the sessions idle longest
        spill to host memory (pinned). None: no limit. Only the CUDA backend parks on a device."""
        self.table.parking.device_limit = nbytes

    def limit_parked(self, nbytes: int | None) -> None:
        """Parked copies may hold `nbytes` in all (None: no limit): a session that would take them
        past it does not park (ParkingFull: a new session needing its row fails; a parked one coming
        back waits, or fails when every row holds an idle session and waiting would free none)."""
        self.table.parking.limit = nbytes

    def parked_size(self, length: int) -> int:
        """What a session holding `length` tokens holds parked: its KV positions and its logits row."""
        block = self.pool.block
        per_position = int(block.nbytes) // (int(block.shape[2]) * int(block.shape[4]))
        return per_position * length + self.info.vocab_size * _dtype(self.info.logits.dtype).itemsize

    def close(self) -> None:
        self.decoder.settle()
        self.variants.clear()
