"""Quantisation, fragments and the messages of the data plane (protocol and error bound: the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np



INT32_MAX = 2**31 - 1
#: exponent of an all-zero fragment: below any real one, so it never coarsens a sum
ZERO_EXP = -1100
#: |q| <= 2^31, so a right shift by more than 32 bits rounds to 0
MAX_SHIFT = 40


# -- quantisation ----------------------------------------------------------------------


def headroom(fan_in: int) -> int:
    """Largest |q| one contributor may send so that ``fan_in`` of them sum within int32."""
    if fan_in < 1:
        raise ValueError(f"fan_in must be at least 1, got {fan_in}")
    return INT32_MAX // fan_in


def exponents(maxabs: np.ndarray, limit: int) -> np.ndarray:
    """Per fragment, the smallest e with maxabs * 2^-e <= limit (``ZERO_EXP`` where maxabs is 0).

    Found from frexp and then corrected with exact comparisons (ldexp is
    exact), so the headroom is never exceeded by a rounding of the estimate.
    """
    m = np.asarray(maxabs, dtype=np.float64)
    pos = m > 0
    _, e = np.frexp(np.where(pos, m, 1.0) / limit)
    e = e.astype(np.int64)
    m0 = np.where(pos, m, 0.0)
    while (up := np.ldexp(m0, -e) > limit).any():
        e = e + up
    while (down := pos & (np.ldexp(m0, -(e - 1)) <= limit)).any():
        e = e - down
    return np.where(pos, e, ZERO_EXP)


def quantise(blocks: np.ndarray, fan_in: int, agreed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows of values -> (int32 rows q, one exponent per row) with value ~ q * 2^e, |q| <= headroom.

    ``agreed``: exponents settled with the other workers of the node first
    (each at least this row's own, so |q| <= headroom still holds).
    """
    v = np.asarray(blocks, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("cannot quantise a gradient with inf or nan values")
    limit = headroom(fan_in)
    own = exponents(np.abs(v).max(axis=1, initial=0.0), limit)
    if agreed is None:
        e = own
    else:
        e = np.asarray(agreed, dtype=np.int64)
        if e.shape != own.shape or (e < own).any():
            raise ValueError("an agreed exponent is below a fragment's own: its values would overflow the headroom")
    q = np.rint(np.ldexp(v, -e[:, None]))
    return q.astype(np.int32), e


def agree(proposals: list[np.ndarray]) -> np.ndarray:
    """The exponents a node's workers settle on: per fragment the largest any of them needs (SwitchML's block exponent)."""
    return np.max(np.stack(proposals), axis=0)


def dequantise(values: np.ndarray, exp: int) -> np.ndarray:
    """int values * 2^exp as float64 (exact: |values| < 2^53)."""
    return np.ldexp(values.astype(np.float64), exp)


def rshift_round(a: np.ndarray, d: int) -> np.ndarray:
    """round(a / 2^d), ties up, in exact integer arithmetic: error at most half a unit."""
    if d <= 0:
        return a
    if d > MAX_SHIFT:
        return np.zeros_like(a)
    return (a + (1 << (d - 1))) >> d


def fragment_count(n_values: int, fragment_size: int) -> int:
    return -(-n_values // fragment_size)


def fragment_slice(fragment: int, fragment_size: int, n_values: int) -> slice:
    return slice(fragment * fragment_size, min((fragment + 1) * fragment_size, n_values))


# -- messages ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Fragment:
    """F quantised values of one worker's gradient, addressed to one aggregation node."""

    round: int
    node: str  # the aggregation node it is addressed to (a switch, or the PS)
    fragment: int
    worker: str
    fan_in: int  # workers assigned to `node`: sets the headroom (checked by the switch)
    values: np.ndarray  # int32
    exp: int  # value = values * 2^exp
    attempt: int = 0  # 0 for the first transmission


@dataclass(frozen=True, eq=False)
class Aggregate:
    """A switch's sum of one fragment over a set of its workers (all of them if complete)."""

    round: int
    node: str  # the switch that summed it
    fragment: int
    workers: frozenset[str]
    values: np.ndarray  # int32
    exp: int
    complete: bool


@dataclass(frozen=True)
class Ack:
    """The PS holds ``worker``'s contribution to this fragment: stop resending it."""

    round: int
    fragment: int
    worker: str


Message = Fragment | Aggregate | Ack
