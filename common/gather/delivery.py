"""How an iteration's model reaches the workers when it is relayed (``JobSpec.model_delivery``): the layout the
master plans (:class:`~gradcode.master.rounds.RoundPolicy`) and the simulator times
(:func:`~gradcode.common.sim.simulate.simulate`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_MODEL_DELIVERY", "MODEL_DELIVERIES", "RELAY_FANOUT", "RELAY_MIN_WORKERS", "relay_peers", "relays"]

MODEL_DELIVERIES = ("direct", "relay", "auto")
"""JobSpec.model_delivery: the master sends each iteration's model to every worker (direct), or inline to a few and
the others fetch it from a peer, checked by its digest (relay: :mod:`gradcode.worker.relay`), or relays when a round
asks enough workers of a flat code over the network (auto; a tree relays only when asked: :func:`relays`)."""
DEFAULT_MODEL_DELIVERY = "direct"
"""Relaying pays where the master's link is the bottleneck and costs a hop and the peers' CPU where it is not
(``python -m gradcode.bench.cluster --n 6 --systems uncoded fractional --surplus hold --model-delivery direct relay``,
p = 1e5, workers at 25% of a core and 1 Gbit/s): with the master's link at 200 Mbit/s relay took uncoded from 375 to
268 ms per iteration and fractional s = 1 (held surplus) from 293 to 168 ms (175 with a 0.25 s straggler; the master
sent 0.8 MB per iteration instead of 5.0); with it at 1 Gbit/s relay gained nothing (78 vs 80 ms, 62 vs 63) and a
straggler iteration took 1.05-1.26x longer. The master cannot tell its links' speed, so the default stays direct:
choose relay (or auto) when the master's link is slower than its workers' together."""
RELAY_FANOUT = 3
"""Fetchers per relay peer: worker j of an iteration's relay order fetches the model from worker (j - 1) // 3, so
n = 6 is a seed serving three workers, two of which serve one more each (two hops). A peer's link carries the model
this many times while its own fetch adds a hop's latency to its fetchers'; the master's carries it once either way."""


def relay_peers(order: Sequence[int]) -> dict[int, int]:
    """The peer each worker of ``order`` fetches the model from: ``order[j]`` from ``order[(j - 1) //``
    :data:`RELAY_FANOUT` ``]``; the first, the seed, gets it from the master and is not in the mapping."""
    return {w: order[(j - 1) // RELAY_FANOUT] for j, w in enumerate(order) if j}


RELAY_MIN_WORKERS = 3
"""``JobSpec.model_delivery`` "auto" relays when a round's first gather asks at least this many workers over the
network (with fewer, the master's link carries two models or less and a relay hop would cost more than it saves)."""


def relays(mode: str, *, network: int, tree: bool = False) -> bool:
    """Whether a round relays the model (``JobSpec.model_delivery`` ``mode``) to the ``network`` workers its first
    gather asks over the network (a tree's: the parents of the first layer, who forward it to their children):
    "relay" when there are two or more, "auto" when :data:`RELAY_MIN_WORKERS` or more of a flat code's; never
    "direct". A tree relays only when asked: its first layer is few (the master sends a handful of models) and its
    parents are busy, and on every emulated cluster measured the relaying seed parent, serving three fetchers
    beside its own children, made the tree slower (n = 24, p = 1e5: 1.9-2.8x at 12 % of a core, 1.07-1.25x at 7 %;
    p = 1e6: 1.06-1.4x; docs/cluster.md)."""
    if mode == "auto" and tree:
        return False
    return (mode == "relay" and network >= 2) or (mode == "auto" and network >= RELAY_MIN_WORKERS)
