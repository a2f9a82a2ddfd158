"""What a code tells the master about its shape, so the master never names a scheme.

* :class:`CodeSize` — the worker processes and data partitions a configuration implies, known from its
  parameters *before* the code is built (:meth:`GradientCode.implied_size`), so size caps can refuse
  an oversized job without building it.
* :class:`Topology` — how the workers of a code are arranged when they are not all children of the
  master (a CodedReduce tree, :meth:`GradientCode.topology`): how many worker processes there are,
  who is whose parent, the one row each node is loaded with, which code a parent decodes its children
  with, and how long each parent waits for them. ``None`` means flat: every worker answers the master.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CodeRef", "CodeSize", "NodeRow", "Topology", "descendants", "size_parameter"]


@dataclass(frozen=True)
class CodeSize:
    """Worker processes and data partitions a configuration implies (None: not known from the parameters)."""

    workers: float | None = None
    partitions: float | None = None
    advice: str = ""
    """How to shrink the configuration when it is too large (for messages)."""


def size_parameter(params: Mapping[str, object], name: str, default: object = None) -> float | None:
    """``params[name]`` as a finite plain number, or None (a parameter that is not one is make_code's to refuse)."""
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class NodeRow:
    """The one message row a topology node computes: its row id and ``sum(coefficients[i] * g[partitions[i]])``."""

    row: int
    partitions: tuple[int, ...]
    coefficients: tuple[float, ...]


@dataclass(frozen=True)
class CodeRef:
    """A code by registry name and parameters (what :func:`~gradcode.common.codes.registry.make_code` takes)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


class Topology(Protocol):
    """The worker layout of a code whose workers are not all children of the master.

    Worker indices ``0..n-1`` are the code's own workers (the master asks them and decodes with the
    code's decoder); ``n..num_workers-1`` are deeper nodes, which only their parents ask.
    """

    @property
    def num_workers(self) -> int:
        """Every worker process the topology needs."""
        ...

    @property
    def child_code(self) -> CodeRef:
        """The code every parent decodes its children with."""
        ...

    def describe(self) -> str:
        """What the workers are, for messages (e.g. "every node of the n=2, L=2 tree")."""
        ...

    def parent_of(self) -> list[int]:
        """The parent worker index of every worker, -1 under the master."""
        ...

    def children(self, w: int) -> list[int]:
        """Worker indices of ``w``'s children, in slot order (empty for a leaf)."""
        ...

    def row(self, w: int) -> NodeRow:
        """Worker ``w``'s one row: its slot in its parent's code, over its own stored partitions."""
        ...

    def wait_seconds(self, w: int, deadline_seconds: float) -> float:
        """How long parent ``w`` waits for its children within an iteration deadline (deeper: shorter)."""
        ...


def descendants(topology: Topology, w: int) -> frozenset[int]:
    """The worker indices below ``w`` in ``topology`` (empty for a leaf): the only nodes ``w``'s messages may speak
    of (lost, singled out, quarantined, late, timed), so a lying node cannot name one outside its subtree."""
    below: set[int] = set()
    stack = list(topology.children(w))
    while stack:
        node = stack.pop()
        below.add(node)
        stack.extend(topology.children(node))
    return frozenset(below)
