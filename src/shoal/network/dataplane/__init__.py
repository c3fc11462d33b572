"""The GRID data plane as pure objects: workers, software aggregation switches, the PS.

A plan (``network.Plan.assignment``) sends each worker's gradient to one
aggregation node: a programmable switch or the PS. This package carries that
plan out on real gradients, one module per role: ``wire`` (quantisation,
fragments, messages), ``worker``, ``switch``, ``server`` (the PS) and
``rounds`` (a plan's nodes, a whole round in-process, the error bound).
Everything here is a plain object driven by messages and an explicit clock (no threads, sockets, sleeps or Ray): the ray
backend wraps one object per actor (``build_nodes`` makes them for a plan,
``Nodes.deliver`` shows the routing) and moves the messages, the sim backend
can read the counters, and ``run_round`` drives a whole round in-process.

Protocol (one round r):

- ``Worker.send`` cuts the flat gradient into fragments of F values, tagged
  (round, aggregation node, fragment id, worker) and quantised to int32
  (below), and keeps each one until it is acknowledged; ``due_resends(now)``
  returns those not acknowledged within ``timeout``.
- ``Switch.receive`` sums fragments addressed to it in a fixed array of
  memory units (slots). A fragment hashes to unit ``(fragment id + r) mod
  slots`` (``probes`` > 1 also tries the next units). Its own unit: add it,
  once per worker (the unit keeps the set of workers seen). A free unit:
  claim it. Otherwise the fragment is not aggregated but forwarded to the
  PS as it is (``fallbacks_collision``: the unit holds another fragment;
  ``fallbacks_full``: every unit is taken), as ATP and SwitchML do. When
  every worker assigned to the switch has contributed, the sum goes to the
  PS and the unit is freed. A resend from a worker the unit has already
  seen means that worker was never acknowledged, so the unit is stuck
  (another contributor fell back, or was lost): the switch flushes the
  partial sum to the PS (``partial_flushes``) and frees the unit. A unit
  left from an older round is stale (rounds are sequential: a fragment of
  round r+1 exists only after the PS finished round r) and is reclaimed.
- ``Server.receive`` takes finished or partial sums (each names the set of
  workers it covers) and single fragments (fallbacks, and workers assigned
  to the PS). Per fragment it keeps disjoint parts, so a contribution is
  counted exactly once: a message whose workers are all covered already is
  a duplicate (re-acknowledged, ignored); one that covers every worker of
  each part it overlaps replaces those parts (a finished sum arriving after
  a fallback of one of its workers); one that overlaps a part only partly
  is rejected, and the workers it alone would have covered resend. The PS
  acknowledges every covered worker, and the round is complete when every
  fragment is covered by every worker.

Quantisation and the error bound. Each worker quantises each fragment on
its own, with no agreement round trip: for a node with K assigned workers
(K = 1 at the PS) the headroom is L = floor((2^31 - 1) / K); with m the
fragment's max |value|, the exponent e is the smallest integer with
m * 2^-e <= L, and q = round(v * 2^-e), so |q| <= L and v = q * 2^e within
2^(e-1). SwitchML instead makes the workers agree on one exponent per block
first (piggybacked on the previous block); here the software switch aligns
exponents itself: a unit's sum is kept at the largest exponent among its
contributors, an incoming fragment with a smaller exponent is shifted right
with rounding, and the sum is shifted when a larger one arrives. Every
aligned contribution stays within L, so K of them always fit in int32 (no
overflow, ever), at the price of at most K - 1 extra roundings of half a
unit. All-zero fragments get exponent ``ZERO_EXP`` and never coarsen a sum.

Hence, per value of a fragment, for a switch with K workers whose largest
|value| in that fragment is M_s (over all its workers):

    |error| < (2K - 1) * M_s / L(K),   L(K) = floor((2^31 - 1) / K),

about 2 K^2 M_s / 2^31 (partial sums and fallbacks of the same workers
together obey the same bound), and for a worker sent to the PS, whose own
largest |value| in the fragment is m_w, |error| < m_w / (2^31 - 1). The
round's sum is the total over nodes plus float64 rounding at the PS, at most
N * 2^-52 * sum_w |v_w| (N workers). ``error_bound`` computes exactly this.
For N workers and K <= K_max it is about N * K_max * M / 2^30, M the largest
|value| in the fragment: below the rounding of summing the N float32
gradients in float32 (about N * M * 2^-24) while K_max <= 64. As in
SwitchML, the shared exponent makes the error relative to the fragment's
largest value, not to each value.
"""

from shoal.network.dataplane.rounds import (
    Envelope, Nodes, Order, RoundResult, build_nodes, error_bound, run_round, switch_groups,
)
from shoal.network.dataplane.server import Server, ServerCounters
from shoal.network.dataplane.switch import Switch, SwitchCounters
from shoal.network.dataplane.wire import (
    INT32_MAX, ZERO_EXP, Ack, Aggregate, Fragment, Message, dequantise, exponents, fragment_count, fragment_slice,
    headroom, quantise,
)
from shoal.network.dataplane.worker import Worker, WorkerCounters

__all__ = [
    "INT32_MAX", "ZERO_EXP", "Ack", "Aggregate", "Envelope", "Fragment", "Message", "Nodes", "Order", "RoundResult",
    "Server", "ServerCounters", "Switch", "SwitchCounters", "Worker", "WorkerCounters", "build_nodes", "dequantise",
    "error_bound", "exponents", "fragment_count", "fragment_slice", "headroom", "quantise", "run_round",
    "switch_groups",
]
