r"""Fractional repetition gradient code (Tandon et al., §3.1 and Appendix B, eqs. (5)–(6)).

With $(s + 1) \mid n$ and $k = n$ partitions, the partitions are cut into $n / (s + 1)$ *groups*
$G_j = \{P_{j(s+1)}, \dots, P_{j(s+1)+s}\}$ of $s + 1$ consecutive partitions (eq. (11)). Each group
is stored by $s + 1$ workers, which all send the same message: the plain sum of the group's partial
gradients. Following eq. (6), $B$ stacks $s + 1$ copies of $\bar B_{\mathrm{block}}(n, s)$, so worker
$i$ (0-based) belongs to group $i \bmod n/(s+1)$.

Decoding needs no linear algebra (proof of Theorem 2): the received rows contain the all-ones vector
exactly when every group has at least one arrival, and then the sum of one survivor per group is the
full gradient. All weights are 0/1, so the decode is exact up to float64 summation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gradcode.common.codes.base import Assignment, Decoding, GradientCode, OnlineDecoder
from gradcode.common.codes.registry import register
from gradcode.common.validation import check_int

__all__ = ["FractionalRepetitionCode", "valid_fractional_stragglers"]


def valid_fractional_stragglers(n: int) -> list[int]:
    """Every ``s`` with ``(s + 1) | n`` and ``0 <= s < n``: the straggler counts fractional repetition supports."""
    return [d - 1 for d in range(1, n + 1) if n % d == 0]


class _OneSurvivorPerGroupDecoder(OnlineDecoder):
    """Remembers the first arrival of each group; decodable once every group has one (Theorem 2).

    ``add`` is $O(1)$; the decoding uses exactly ``n / (s + 1)`` rows, each with weight 1.
    """

    def __init__(self, code: FractionalRepetitionCode, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._groups = code.num_groups
        self._first_of_group: dict[int, int] = {}

    @property
    def decodable(self) -> bool:
        return len(self._first_of_group) == self._groups

    def _on_add(self, row: int) -> None:
        self._first_of_group.setdefault(row % self._groups, row)

    def _decoding(self) -> Decoding:
        rows = tuple(self._first_of_group[g] for g in range(self._groups))
        return Decoding(rows, np.ones(len(rows)), exact=True)


@register
class FractionalRepetitionCode(GradientCode):
    r"""Fractional repetition (Tandon et al., §3.1): $n/(s+1)$ groups of $s+1$ identical workers.

    Arguments:
        n: number of workers (and of data partitions, $k = n$).
        s: number of full stragglers to tolerate; $s + 1$ must divide $n$.

    Examples:
        >>> code = FractionalRepetitionCode(6, 2)   # Figure 2 of the paper
        >>> code.partitions_of_worker(4)            # worker 4 is in group 4 mod 2 = 0
        (0, 1, 2)
    """

    name = "fractional"
    decode_cost = "O(1) per message (group bookkeeping), 0/1 weights"
    cheap_decodes = True

    def __init__(self, n: int, s: int) -> None:
        n = check_int("n", n, 1)
        s = check_int("s", s, 0, n - 1, why="a code over n workers tolerates at most n - 1 stragglers")
        if n % (s + 1) != 0:
            raise ValueError(
                f"Argument 's' must satisfy (s + 1) | n for fractional repetition; with n = {n} the valid "
                f"values are {valid_fractional_stragglers(n)}, not {s}."
            )
        super().__init__(n, n, s)
        groups = n // (s + 1)
        # Eq. (5): the block puts 1s on partitions j(s+1) .. j(s+1)+s in row j; eq. (6) stacks s + 1 copies.
        block = np.kron(np.eye(groups), np.ones((1, s + 1)))
        self._set_matrix(np.tile(block, (s + 1, 1)))

    @property
    def num_groups(self) -> int:
        """Number of partition groups, $n / (s + 1)$; worker ``i`` serves group ``i mod num_groups``."""
        return self.n // (self.s + 1)

    def group_of(self, worker: int) -> int:
        """The partition group whose sum ``worker`` sends."""
        return check_int("worker", worker, 0, self.n - 1) % self.num_groups

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _OneSurvivorPerGroupDecoder(self, assignment or self.static_assignment())

    def _params(self) -> dict[str, object]:
        return {"n": self.n, "s": self.s}

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> FractionalRepetitionCode:
        return cls(n=n, s=s)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, int]]:
        for n in range(1, max_n + 1):
            for s in valid_fractional_stragglers(n):
                yield {"n": n, "s": s}
