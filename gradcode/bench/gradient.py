"""How fast is a worker's gradient? The built-in models' row blocks, wide rows in one block, against a block per row.

    python -m gradcode.bench.gradient [--quick] [--out DIR]

For batches from Tandon et al.'s (4000 rows of 2000 features) to CodedReduce's at p = 10⁶ (16 rows of 10⁶), it
times :meth:`~gradcode.common.training.models.Model.gradient_and_statistics` of the linear and logistic models
with one BLAS thread (as a worker runs: ``--threads 1``), two ways, call by call in turn (A, B, A, B, ...):

* ``shipped``: row blocks of :data:`~gradcode.common.training.models.BLOCK_BYTES`, and the batch in one block when
  fewer than :data:`~gradcode.common.training.models.MIN_BLOCK_ROWS` rows fit;
* ``row_blocks``: the rule before, as many rows as fit and at least one (``min_block_rows = 1``): at p = 10⁶ a
  block per 8 MB row (its first block takes the shipped one-row product, the others numpy's matmul as before).

It prints the medians, the paired ratio shipped / row_blocks (median and range) and the load, and saves
``gradient.json`` and ``gradient.png`` in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from gradcode.bench.output import RESULTS, figure, load_average, quick_or_full_main, save
from gradcode.common.training.models import Model, make_model

__all__ = ["BATCHES", "QUICK_BATCHES", "main", "run", "time_batch"]

BATCHES = ((4000, 2000), (16, 100_000), (160, 100_000), (64, 262_144), (16, 1_000_000))
"""(rows, features) of the batches timed: Tandon's partition, CodedReduce's rows at p = 10⁵ and 10⁶, and between."""
QUICK_BATCHES = ((64, 200), (4, 70_000))
KINDS = ("linear", "logistic")


def _models(kind: str, features: int) -> tuple[Model, Model]:
    """The shipped model and the same one with the block rule before (at least one row per block)."""
    shipped = make_model(kind, num_features=features)
    before = type(f"RowBlocks{type(shipped).__name__}", (type(shipped),), {"min_block_rows": 1})
    row_blocks: Model = before(features)
    return shipped, row_blocks


def time_batch(kind: str, rows: int, features: int, repeats: int) -> dict[str, Any]:
    """``repeats`` interleaved pairs of gradient evaluations of one seeded batch; medians and paired ratios."""
    rng = np.random.default_rng(rows * 1_000_003 + features)
    X = rng.standard_normal((rows, features))
    y = (rng.random(rows) > 0.5).astype(np.float64) if kind == "logistic" else rng.standard_normal(rows)
    shipped, row_blocks = _models(kind, features)
    params = 0.01 * rng.standard_normal(shipped.num_params)
    times: dict[str, list[float]] = {"shipped": [], "row_blocks": []}
    last: dict[str, Any] = {}
    for _ in range(repeats):
        for name, model in (("shipped", shipped), ("row_blocks", row_blocks)):
            start = time.perf_counter()
            last[name] = model.gradient_and_statistics(params, X, y)
            times[name].append(time.perf_counter() - start)
    same = bool(np.allclose(last["row_blocks"], last["shipped"], rtol=1e-12, atol=1e-9))
    ratios = [a / b for a, b in zip(times["shipped"], times["row_blocks"], strict=True)]
    return {
        "kind": kind, "rows": rows, "features": features, "x_mb": X.nbytes / 1e6, "repeats": repeats,
        "shipped_s": statistics.median(times["shipped"]), "row_blocks_s": statistics.median(times["row_blocks"]),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "same_gradient": same,
    }  # fmt: skip


def _plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with figure(path, figsize=(9, 4), dpi=120) as ax:
        labels = [f"{r['kind']}\n{r['rows']}×{r['features']:.0e}" for r in rows]
        medians = [r["ratio_median"] for r in rows]
        ax.bar(range(len(rows)), medians, color="tab:blue")
        below = [r["ratio_median"] - r["ratio_min"] for r in rows]
        above = [r["ratio_max"] - r["ratio_median"] for r in rows]
        ax.errorbar(range(len(rows)), medians, yerr=[below, above], fmt="none", color="black", capsize=3)
        ax.axhline(1.0, color="tab:red", linestyle="--", label="as fast as a block per row")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel("time shipped / time with row blocks")
        ax.set_title("A worker's gradient, one BLAS thread (paired ratios: median, range)")
        ax.legend(fontsize=8)


def run(*, quick: bool = False, out: Path = RESULTS) -> dict[str, Any]:
    """Time every batch and model, print the table, save JSON and PNG under ``out``; return the results."""
    load_before = load_average()
    with threadpool_limits(limits=1):
        rows = [
            time_batch(kind, r, f, 3 if quick else 9)
            for r, f in (QUICK_BATCHES if quick else BATCHES)
            for kind in KINDS
        ]
    results = {"quick": quick, "rows": rows, "load_before": load_before, "load_after": load_average()}
    print(f"{'model':>9} {'batch':>16} {'X MB':>7} {'shipped ms':>11} {'row blocks ms':>14} {'ratio':>6} {'range':>11}")
    for r in rows:
        print(
            f"{r['kind']:>9} {r['rows']:>7} × {r['features']:<7} {r['x_mb']:>7.0f} {1e3 * r['shipped_s']:>11.2f} "
            f"{1e3 * r['row_blocks_s']:>14.2f} {r['ratio_median']:>6.2f} {r['ratio_min']:>5.2f}-{r['ratio_max']:.2f}"
        )
    print(f"(one BLAS thread; ratio: shipped / row blocks, paired; load {load_before} -> {results['load_after']})")
    save(results, out, "gradient", lambda path: _plot(rows, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    quick_or_full_main("gradient", __doc__, quick="two small batches, three pairs: a smoke run", run=run, argv=argv)


if __name__ == "__main__":
    main()
