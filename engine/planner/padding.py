"""Whether a prefill may be padded: the refusals of the seed, as values.

Padding is refused, never half-applied, when the switch is off, when the
decoder carries recurrent or convolutional state (an extra step cannot be
taken back), when the session's self-check has turned it off, or when any
supplied port is not shaped [1, rows, ...] (it cannot be shown per-token).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PaddingRefusal(StrEnum):
    DISABLED = "disabled by configuration"
    RECURRENT_STATE = "decoder carries recurrent state"
    SELF_CHECK = "self-check found the decoder contracts the query axis"
    PORT_NOT_PER_TOKEN = "a supplied port is not shaped [1, rows, ...]"


@dataclass(frozen=True)
class PortShape:
    """A tensor supplied with the prompt, besides the token ids (inputs_embeds and the like)."""

    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PaddingPolicy:
    """What the planner knows about the model and session when it decides on padding."""

    enabled: bool = True
    recurrent_state: bool = False
    session_padding_on: bool = True


@dataclass(frozen=True)
class PaddingDecision:
    allowed: bool
    refusal: PaddingRefusal | None = None
    detail: str = ""
    per_token_ports: tuple[str, ...] = ()


def is_per_token(port: PortShape, rows: int) -> bool:
    """A port is per-token when it is shaped [1, rows, ...]."""
    return len(port.shape) >= 2 and port.shape[0] == 1 and port.shape[1] == rows


def decide_padding(policy: PaddingPolicy, rows: int, ports: tuple[PortShape, ...] = ()) -> PaddingDecision:
    """Allow padding only if no refusal applies; name the per-token ports to widen."""
    per_token = tuple(p.name for p in ports if is_per_token(p, rows))
    if not policy.enabled:
        return PaddingDecision(False, PaddingRefusal.DISABLED, per_token_ports=per_token)
    if policy.recurrent_state:
        return PaddingDecision(False, PaddingRefusal.RECURRENT_STATE, per_token_ports=per_token)
    if not policy.session_padding_on:
        return PaddingDecision(False, PaddingRefusal.SELF_CHECK, per_token_ports=per_token)
    odd = [p.name for p in ports if not is_per_token(p, rows)]
    if odd:
        return PaddingDecision(
            False, PaddingRefusal.PORT_NOT_PER_TOKEN, ", ".join(odd), per_token_ports=per_token
        )
    return PaddingDecision(True, per_token_ports=per_token)
