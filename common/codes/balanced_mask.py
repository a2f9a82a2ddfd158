r"""Balanced 0/1 mask matrices: the support pattern of the Reed–Solomon gradient code.

Halbawi, Azizan-Ruhi, Salehi, Hassibi, *Improving Distributed Gradient Descent Using Reed–Solomon
Codes*, §3.1 and Appendix 8.2. A mask $M \in \{0,1\}^{n \times k}$ says which of the $k$ data
partitions each of the $n$ workers holds. The Reed–Solomon code needs every row to have exactly
$w$ ones (equal load) and every column as many ones as possible — the smallest column weight $d_l$
fixes the straggler tolerance $s = d_l - 1$ (eq. (2)) — so the columns must differ by at most one
(*column-balanced*, Definition 1).

* :func:`row_balanced_mask` is Algorithm 1: column $j$ gets $d$ cyclically consecutive ones starting
  at row $(jd + t)_n$; row weights then differ by at most one (Proposition 2).
* :func:`mask_matrix` is Algorithm 4: $k_h = (nw)_k$ "heavy" columns of weight
  $d_h = \lceil nw/k \rceil$ followed by $k_l = k - k_h$ "light" columns of weight
  $d_l = \lfloor nw/k \rfloor$, the light block offset by $t = (k_h d_h)_n$ so that its heavy rows
  land on the heavy block's light rows (Lemma 1): every row gets exactly $w$ ones.

Paper readings: Algorithm 4 is labelled "Row-balanced" in its output line; what it returns is
column-balanced with every row of weight exactly $w$ (as §8.3 proves). Corollary 1's row set
"$\{0, t-1\}$" means $\{0, \ldots, t-1\}$. With offset $t = (k_h d_h)_n$ the light block simply
continues the cyclic fill where the heavy block stopped, so column $j$ is the cyclic arc of rows
starting at $(\sum_{j' < j} d_{j'})_n$ — :func:`column_arcs` returns those arcs, which the
encoder uses directly.
"""

from __future__ import annotations

import numpy as np

from gradcode.common.codes.base import Array
from gradcode.common.validation import check_int

__all__ = ["column_arcs", "column_weights", "mask_matrix", "row_balanced_mask"]


def row_balanced_mask(n: int, k: int, d: int, t: int = 0) -> Array:
    r"""Algorithm 1, RowBalancedMaskMatrix$(n, k, d, t)$: columns of weight $d$, rows balanced.

    Column $j$ has ones in rows $(i + jd + t)_n$ for $i = 0, \ldots, d - 1$. Row weights are
    $\lfloor kd/n \rfloor$ or $\lceil kd/n \rceil$ (Proposition 2, Corollary 1).

    Arguments:
        n: number of rows (workers), at least 1.
        k: number of columns (partitions), at least 0 (Algorithm 4 may ask for an empty block).
        d: weight of every column, in $[0, n]$ (Algorithm 4 asks for $d_l = 0$ when $nw < k$).
        t: cyclic offset (any integer, taken modulo $n$).

    Returns:
        An ``(n, k)`` int8 array of zeros and ones.
    """
    n = check_int("n", n, 1)
    k = check_int("k", k, 0)
    d = check_int("d", d, 0, n, why="a column cannot have more ones than there are rows")
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise ValueError(f"Argument 't' must be an integer, not {t!r}.")
    mask = np.zeros((n, k), dtype=np.int8)
    rows = (np.arange(d)[None, :] + np.arange(k)[:, None] * d + int(t)) % n  # (k, d)
    mask[rows, np.arange(k)[:, None]] = 1
    return mask


def column_weights(n: int, k: int, w: int) -> tuple[int, int, int]:
    r"""$(k_h, d_h, d_l)$ of Algorithm 4: $k_h = (nw)_k$ columns of weight $\lceil nw/k \rceil$, the
    other $k - k_h$ of weight $d_l = \lfloor nw/k \rfloor$ (when $k \mid nw$, $k_h = 0$, $d_h = d_l$)."""
    n = check_int("n", n, 1)
    k = check_int("k", k, 1)
    w = check_int("w", w, 1, k, why="a worker cannot hold more partitions than there are")
    heavy = (n * w) % k
    light_weight = (n * w) // k
    return heavy, light_weight + (1 if heavy else 0), light_weight


def mask_matrix(n: int, k: int, w: int) -> Array:
    r"""Algorithm 4, MaskMatrix$(n, k, w)$: every row of weight $w$, column weights $\lceil nw/k \rceil$
    or $\lfloor nw/k \rfloor$.

    $M = [M_h \; M_l]$ with $M_h$ = Algorithm 1$(n, k_h, d_h, 0)$ and $M_l$ = Algorithm
    1$(n, k_l, d_l, (k_h d_h)_n)$. For $(n, k, w) = (8, 4, 3)$ this is eq. (5).

    Arguments:
        n: number of workers (rows), at least 1.
        k: number of data partitions (columns), at least 1.
        w: partitions per worker (row weight), in $[1, k]$.

    Returns:
        An ``(n, k)`` int8 array of zeros and ones.
    """
    heavy, heavy_weight, light_weight = column_weights(n, k, w)
    heavy_block = row_balanced_mask(n, heavy, heavy_weight, 0)
    light_block = row_balanced_mask(n, k - heavy, light_weight, (heavy * heavy_weight) % n)
    return np.concatenate([heavy_block, light_block], axis=1)


def column_arcs(n: int, k: int, w: int) -> list[tuple[int, int]]:
    """``(start, weight)`` of every column of :func:`mask_matrix`: its ones are rows
    ``start, start + 1, ..., start + weight - 1`` (mod ``n``)."""
    heavy, heavy_weight, light_weight = column_weights(n, k, w)
    arcs = []
    start = 0
    for j in range(k):
        weight = heavy_weight if j < heavy else light_weight
        arcs.append((start % n, weight))
        start += weight
    return arcs
