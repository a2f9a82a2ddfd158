"""How an iteration's model reaches the workers when it is relayed (``JobSpec.model_delivery``): the layout the
master plans (:class:`~gradcode.master.rounds.RoundPolicy`) and the simulator times
(:func:`~gradcode.common.sim.simulate.simulate`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RELAY_FANOUT", "relay_peers"]

RELAY_FANOUT = 3
"""Fetchers per relay peer: worker j of an iteration's relay order fetches the model from worker (j - 1) // 3, so
n = 6 is a seed serving three workers, two of which serve one more each (two hops). A peer's link carries the model
this many times while its own fetch adds a hop's latency to its fetchers'; the master's carries it once either way."""


def relay_peers(order: Sequence[int]) -> dict[int, int]:
    """The peer each worker of ``order`` fetches the model from: ``order[j]`` from ``order[(j - 1) //``
    :data:`RELAY_FANOUT` ``]``; the first, the seed, gets it from the master and is not in the mapping."""
    return {w: order[(j - 1) // RELAY_FANOUT] for j, w in enumerate(order) if j}
