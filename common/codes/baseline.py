"""The two baselines of Tandon et al. §5: wait for every worker, and ignore the stragglers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gradcode.common.codes.base import Assignment, Decoding, GradientCode, OnlineDecoder
from gradcode.common.codes.registry import register

__all__ = ["IgnoreStragglers", "Uncoded"]


class _CountingDecoder(OnlineDecoder):
    """Decodable once ``needed`` distinct rows arrived; weights ``scale`` on every received row."""

    def __init__(self, code: GradientCode, assignment: Assignment, needed: int, exact: bool) -> None:
        super().__init__(code, assignment)
        self._needed = needed
        self._exact = exact

    @property
    def decodable(self) -> bool:
        return len(self._received) >= self._needed

    def _on_add(self, row: int) -> None:
        pass

    def _decoding(self) -> Decoding:
        rows = tuple(self._received)
        # Uncoded: every row is needed, weight 1. Ignore-stragglers: rescale the sum of the first f
        # partial gradients by k/f so its expectation is the full gradient (it is *not* exact).
        scale = self.code.k / len(rows)
        return Decoding(rows, np.full(len(rows), scale), exact=self._exact)


@register
class Uncoded(GradientCode):
    """Wait for all: worker ``i`` holds partition ``i`` alone and sends ``g_i``; B is the identity.

    Tolerates no straggler (``s = 0``): the iteration waits for the slowest worker.
    """

    name = "uncoded"
    decode_cost = "O(1) per message (count)"
    cheap_decodes = True

    def __init__(self, n: int) -> None:
        super().__init__(n, n, 0)
        self._set_matrix(np.eye(n))

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _CountingDecoder(self, assignment or self.static_assignment(), self.n, exact=True)

    def _params(self) -> dict[str, object]:
        return {"n": self.n}

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        if s != 0:
            raise ValueError(f"The uncoded scheme tolerates no straggler (s = 0), not s = {s}.")
        return cls(n)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, int]]:
        for n in range(1, max_n + 1):
            yield {"n": n}


@register
class IgnoreStragglers(GradientCode):
    """Ignore the stragglers: uncoded placement, step with the first ``n - s`` partial gradients.

    The result is the received sum rescaled by ``n / (n - s)`` and is always flagged approximate
    (``Decoding.exact`` is False): it is the baseline of Tandon et al., not a gradient code.
    """

    name = "ignore_stragglers"
    exact = False
    decode_cost = "O(1) per message (count), approximate"
    cheap_decodes = True

    def __init__(self, n: int, s: int) -> None:
        super().__init__(n, n, s)
        self._set_matrix(np.eye(n))

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _CountingDecoder(self, assignment or self.static_assignment(), self.n - self.s, exact=False)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, int]]:
        for n in range(2, max_n + 1):
            for s in range(1, n):
                yield {"n": n, "s": s}
