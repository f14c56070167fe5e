"""Structured output: constraints (JSON Schema, regex, choice, grammar) compiled into automata over
bytes, and per-row state that says which vocabulary tokens may come next.

The contract the engine relies on (engine/sampling.py applies it):

    compiled = compile_constraint(kind, spec, vocabulary)  # cached by (kind, spec); raises InvalidInput
    row = compiled.start()                                 # one per generated sequence
    row.allowed() -> np.ndarray[bool] of vocabulary.size   # EOS ids set only where the output may end
    row.state_key                                          # hashable: equal keys, equal masks (device cache)
    row.advance(token)                                     # after a chosen token; InvalidInput if not allowed
    row.done                                               # nothing but EOS may follow (output complete)
    row.accepts                                            # the output so far is a whole match
    row.copy()                                             # an independent copy (n samples, fork)

Kinds: "json_schema" (json_schema.py), "regex" (regex.py), "choice" (one of N strings), "grammar"
(grammar.py). ConstraintCache keeps compiled constraints under a byte budget; Limits bounds them.
"""

from engine.constrain.cache import CacheStats, ConstraintCache
from engine.constrain.compiled import KINDS, Compiled, RowState, compile_constraint
from engine.constrain.limits import Limits
from engine.constrain.vocabulary import Vocabulary

__all__ = [
    "KINDS",
    "CacheStats",
    "Compiled",
    "ConstraintCache",
    "Limits",
    "RowState",
    "Vocabulary",
    "compile_constraint",
]
