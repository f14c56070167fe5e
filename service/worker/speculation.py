"""One stream's drafts for speculative decoding (issue #44; engine.planner.drafts holds the pure
parts, engine.executor.engine.Engine.verify the verification): what to draft before a step, and
what a verified step teaches the stream. service/worker/generation.py's decode_steps asks for a draft
before each step it runs alone and tells it what came back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.executor.step import Verified
from engine.planner.drafts import MAX_K, Acceptance, Costs, Lookup
from engine.sampling import Sampler
from service.calls import Stopping
from service.worker.min_tokens import ending_tokens, structured


class Speculation:
    """A prompt lookup over the stream's tokens, how much of a draft is worth verifying (its
    acceptance so far against what forwards cost here: `costs`, the engine's), and the token ids
    its acceptance stops after. It drafts only once the sampler may end the sample (min_tokens
    met): a choice made ahead of its step must be the choice that step would make."""

    def __init__(
        self,
        tokens: Sequence[int],
        sampler: Sampler,
        stopping: Stopping,
        k: int,
        eos_ids: frozenset[int],
        costs: Costs,
        lone: Callable[[], bool] = lambda: True,
    ) -> None:
        self.lookup = Lookup(k=k, tokens=list(tokens))
        self.lone = lone  # whether the stream decodes alone (a draft beside other rows runs plainly)
        self._behind: list[int] = []  # tokens not in the lookup's index yet (added when it drafts)
        self.acceptance = Acceptance()
        self.costs = costs
        self.sampler = sampler
        self.min_tokens = stopping.min_new_tokens
        self.stops = ending_tokens(eos_ids, stopping, structured(sampler) is not None)
        self._forced = False  # the last draft was forced tokens: kept whatever the model says

    def draft(self, room: int, emitted: int) -> tuple[int, ...]:
        """Tokens to verify with the next step, `emitted` tokens into the sample (at most `room`,
        those the budget can still emit): the tokens the row's constraint forces next, else a
        prompt-lookup draft as long as it pays."""
        if room <= 0 or emitted < self.min_tokens or not self.lone():
            return ()  # beside other rows a draft would run as a plain row: no lookup for it
        forced = self.forced(min(room, MAX_K))
        self._forced = bool(forced)
        if forced:
            return forced
        if self._behind:
            self.lookup.extend(self._behind)
            self._behind = []
        draft = self.lookup.propose()[:room]
        return draft[: self.acceptance.length(len(draft), self.costs)]

    def forced(self, most: int) -> tuple[int, ...]:
        """The tokens the constraint allows alone from here on (a JSON key, a closing brace), read on a
        copy of its state: the sampler can choose nothing else, so a draft of them is always kept
        and they cost no forward of their own."""
        constraint = structured(self.sampler)
        if constraint is None or not hasattr(constraint, "copy") or constraint.done:
            return ()
        state, forced = constraint.copy(), list[int]()
        while len(forced) < most:
            allowed = state.allowed().nonzero()[0]  # the mask's allowed token ids
            if len(allowed) != 1 or int(allowed[0]) in self.stops:
                break
            forced.append(int(allowed[0]))
            state.advance(forced[-1])
            if state.done:
                break
        return tuple(forced)

    def chose(self, token: int) -> None:
        """A plain step chose `token` (indexed once the stream drafts again: none while it decodes
        beside other rows)."""
        self._behind.append(token)

    def verified(self, verified: Verified) -> None:
        """A drafted step came back (forced tokens tell nothing of how lookups fare)."""
        if not self._forced:
            self.acceptance.verified(verified.drafted, verified.accepted)
        self._behind.extend(verified.tokens)
