"""Decode rows, the engine's part that feeds each decoding session its token and chooses the next.

A step's rows run in one batched forward (the batch decoder, decode.py) or, on a decoder that
cannot batch sessions, one forward each; a drafted row that decodes alone is verified in one
forward of its token and draft (`verify`, issue #44), beside other rows it runs as a plain row.
Choosing reads the logits the backend keeps for each row (choosing.py). The runner owns whether
drafts are verified at all (`verifies`) and what a lone step and a verification cost here
(`costs`); it is handed the session table, the prefill runner and the decoder it drives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engine.errors import InvalidInput, OverCapacity
from engine.executor.choosing import choose_rows
from engine.executor.decode import BatchDecoder
from engine.executor.prefill import check_ids
from engine.executor.prefilling import Prefiller
from engine.executor.rows import SessionTable
from engine.executor.session import Session
from engine.executor.shape import EngineShape
from engine.executor.step import DecodeRow, Verified
from engine.planner.drafts import MAX_K, Costs, verify_width
from engine.runtime.backend import Backend
from engine.sampling import Sampler

MAX_VERIFY_ROWS = 1  # a drafted row verifies only when it decodes alone: beside other rows its
# forward would be one more for all of them (a batched verification is not built yet)


def drafts_verified(shape: EngineShape) -> bool:
    """Whether drafted rows verify in forwards of their own (`verify`) when asked
    (EngineOptions.speculate): never in the deterministic mode (its forwards are a fresh run's), nor
    on a decoder that decodes each session alone (recurrent state, ports): it cannot rewind a wrong
    draft."""
    options = shape.options
    return options.speculate and not options.deterministic and not shape.unbatched_reason


def _undrafted(row: DecodeRow, token: int | None) -> Verified:
    """A drafted row that ran as a plain decode row: its one token."""
    last = row.sampler.last if row.sampler is not None else None
    return Verified((token,) if token is not None else (), (last,), 0)


class DecodeRunner:
    def __init__(
        self,
        shape: EngineShape,
        backend: Backend[Any],
        decoder: BatchDecoder,
        table: SessionTable,
        prefiller: Prefiller,
        token_ids_only: bool,
    ) -> None:
        self.shape = shape
        self.backend = backend
        self.decoder = decoder
        self.table = table
        self.prefiller = prefiller
        self.token_ids_only = token_ids_only
        self.verifies = drafts_verified(shape)  # off for good when a head cannot read rows back
        self.costs = Costs()  # what a lone stream's step and a verification forward take here

    def check_decode(self, row: DecodeRow) -> None:
        """Raise the request error a decode row would fail with, before it joins a step."""
        session, vocab = row.session, self.shape.info.vocab_size
        self.table.check_open(session)
        if not self.token_ids_only:
            raise InvalidInput("this model takes inputs besides token ids: decode by appending them")
        if not 0 <= row.token < vocab:  # one comparison per row and step; check_ids words it
            check_ids([row.token], vocab)
        if session.length + 1 > self.shape.capacity:
            raise OverCapacity(f"the session holds {session.length} tokens: its KV capacity is full")
        if row.drafts:
            check_ids(row.drafts, vocab)

    def decode(self, rows: Sequence[DecodeRow]) -> list[int | None | Verified]:
        """Feed one token to each session in one forward (one per session when unbatched); choose the
        next (a drafted row: `Verified`, see `decode_checked`)."""
        for row in rows:
            self.check_decode(row)
        return self.decode_checked(rows)

    def decode_checked(self, rows: Sequence[DecodeRow]) -> list[int | None | Verified]:
        """`decode` of rows that each passed `check_decode` since their sessions last changed (the
        scheduler checks a row as its job asks for it, so a bad row fails alone, not its batch).
        A drafted row's value is `Verified`: verified in a forward of its own when it decodes
        alone, else run as a plain row beside the others (MAX_VERIFY_ROWS)."""
        if len({r.session.row for r in rows}) != len(rows):
            raise InvalidInput("a session appears twice in one decode step")
        if not any(r.drafts for r in rows):
            return list(self._decode_plain(rows))
        if len(rows) <= MAX_VERIFY_ROWS and self.verifies:
            return [self.verify(rows[0])]
        plain = self._decode_plain([replace(r, drafts=()) for r in rows])
        return [_undrafted(r, t) if r.drafts else t for r, t in zip(rows, plain, strict=True)]

    def verify(self, row: DecodeRow) -> Verified:
        """Feed the row's token and its draft in one forward (`verify_forward`) and choose from each
        row in turn with the row's sampler, as a decode step would from that row: the draft's next
        token is kept for as long as the choice equals it (for a sampled row this is sampling
        itself, so the output's distribution and a seeded row's draws are a plain decode's), and
        not past a stop id or the token that completes the row's constraint. The session then
        holds the token and the accepted draft; the rows past them are rewound."""
        started = time.perf_counter()
        session, sampler = row.session, row.sampler
        if sampler is None:
            raise InvalidInput("a drafted decode row needs a sampler")
        drafts = row.drafts[: max(0, min(MAX_K, self.shape.capacity - session.length - 1))]
        out = self.prefiller.verify_forward(session, [row.token, *drafts]) if drafts else None
        if out is None:
            self.verifies = self.verifies and not drafts  # the head cannot read every row back
            return _undrafted(row, self._decode_plain([replace(row, drafts=())])[0])
        past, tokens, logprobs = session.length, [], []
        for i, fed in enumerate((row.token, *drafts)):
            self.decoder.pool.commit(session, past + i + 1)
            session.tokens.append(fed)
            self.backend.keep_row(session.row, out.logits, i)
            session.has_logits = True
            tokens.append(self.choose_rows([session], [sampler])[0])
            logprobs.append(sampler.last)
            ended = tokens[-1] in row.stops or (sampler.constraint is not None and sampler.constraint.done)
            if ended or i == len(drafts) or tokens[-1] != drafts[i]:
                break
        session.stats.decode_steps += 1
        self.decoder.counters.verified(len(drafts), len(tokens) - 1)
        self.decoder.counters.last_batch = 1
        self.costs.saw_verify(verify_width(len(drafts) + 1), time.perf_counter() - started)
        return Verified(tuple(tokens), tuple(logprobs), len(drafts))

    def _decode_plain(self, rows: Sequence[DecodeRow]) -> list[int | None]:
        chosen = [r for r in rows if r.sampler is not None]

        samplers: list[Sampler] = [r.sampler for r in chosen]  # type: ignore[misc]

        def choose(picked: list[int] | None = None) -> list[int]:
            return self.choose_rows([r.session for r in chosen], samplers, picked)

        if self.shape.unbatched_reason:
            for row in rows:
                self._decode_alone(row)
            self.decoder.counters.last_batch = 1
            tokens = choose()
        elif rows:
            options = self.shape.options
            ahead = options.lookahead and len(chosen) == len(rows) and all(r.more for r in rows)
            # The deterministic mode runs every decode forward at the widest batch: a row's
            # numerics then never follow how many other rows decode beside it.
            least = self.decoder.pool.rows if options.deterministic else 1
            chainable = ahead and options.decode_chain and all(s.plain for s in samplers)
            plain = samplers if chainable else None
            feeds = {r.session.row: r.token for r in rows}
            width = self.decoder.width(len(rows), least)
            if max(feeds) >= width:  # a hole below a decoding row: rarely, and never in steady decode
                self.table.compact([r.session for r in rows], width)
                feeds = {r.session.row: r.token for r in rows}
            started = time.perf_counter()
            tokens = self.decoder.step(feeds, choose, ahead, least, plain)
            if len(rows) == 1 and chosen:  # what a lone stream's step costs, against a verification
                self.costs.saw_step(time.perf_counter() - started)
        else:
            tokens = []
        for row in rows:
            row.session.stats.decode_steps += 1
        picked = iter(tokens)
        return [next(picked) if r.sampler is not None else None for r in rows]

    def _decode_alone(self, row: DecodeRow) -> None:
        task = self.prefiller.start_prefill(row.session, [row.token])
        self.prefiller.prefill_step(task)

    def choose(self, session: Session, sampler: Sampler) -> int:
        """The next token from the session's held logits (no forward)."""
        self._check_logits(session)
        return self.choose_rows([session], [sampler])[0]

    def choose_rows(
        self, sessions: Sequence[Session], samplers: Sequence[Sampler], picked: list[int] | None = None
    ) -> list[int]:
        """Choose each session's next token and tell its sampler (engine/executor/choosing.py)."""
        return choose_rows(self.backend, self.decoder.pool.rows, sessions, samplers, picked)

    def logits(self, session: Session) -> np.ndarray:
        """A host copy of the session's next-token logits [vocab]."""
        self._check_logits(session)
        return self.backend.row_logits(session.row)

    def check_choose(self, session: Session) -> None:
        """Raise the request error choosing a session's next token would fail with."""
        self._check_logits(session)

    def _check_logits(self, session: Session) -> None:
        self.table.check_open(session)
        if not session.has_logits:
            raise OverCapacity("the session has no next-token logits (it is empty)")
