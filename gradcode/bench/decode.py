"""How fast is Reed–Solomon decoding? Decoding coefficients vs generic solvers, combine vs memory copy.

    python -m gradcode.bench.decode [--quick] [--out DIR]

Decoding coefficients, for n in {10, 20, ..., 1280}, s = n / 5, f = n - s, on one seeded random
survivor set per n (the same set for every method):

* ``rs_fast``: :func:`gradcode.common.codes.reed_solomon.decoding_weights`, the O(f·s) closed form the decoder
  uses;
* ``rs_alg3``: Algorithm 3 of Halbawi et al., O(f²) table look-ups;
* ``rs_online``: a whole online decoder (f ``add`` calls, then ``decoding()``; the guard is off, so
  no sub-f span test runs);
* ``lstsq``: ``numpy.linalg.lstsq`` on B_F^T a = 1 (k = n; B's columns scaled to unit norm so that
  LAPACK does not overflow at large n), the generic decoder's solve;
* ``lu``: ``numpy.linalg.solve`` (LU) on the square f x f Vandermonde system G_F^T a = e_1 (eq. 12).

The generic solvers get their matrices pre-built (only the solve is timed). Codes are built with
``max_decode_error=math.inf``: numerical accuracy at large n is irrelevant to the arithmetic timed.

Combine, for p in {1e5, 1e6} complex128 coordinates and several f: ``Decoding.combine`` (sum of
a_i m_i, real part) against a plain numpy copy of the same message bytes measured in the same run;
``ratio`` = copy time / combine time, i.e. combine's share of the machine's copy bandwidth.

Prints a table and saves ``decode.json`` and ``decode.png`` in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import math
import os
import platform
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.output import RESULTS, figure, quick_or_full_main, save
from gradcode.common.codes.base import Decoding
from gradcode.common.codes.numerics import survivor_sets
from gradcode.common.codes.reed_solomon import (
    ReedSolomonCode,
    decoding_weights,
    decoding_weights_algorithm3,
    encoding_matrix,
)

FULL_SIZES = (10, 20, 40, 80, 160, 320, 640, 1280)
QUICK_SIZES = (10, 20)
FULL_COMBINE = ((100_000, (8, 64, 256)), (1_000_000, (8, 32, 64)))
QUICK_COMBINE = ((10_000, (8,)),)
MAX_COMBINE_BYTES = 1_100_000_000
"""Skip combine cases whose messages would take more memory than this."""
TARGET_SPEEDUP_VS_LSTSQ = 50.0
TARGET_COMBINE_RATIO = 0.6


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Seconds per call: the best of ``repeat`` runs of a loop auto-ranged to at least 0.2 s.

    ``repeat=1`` (the quick smoke run) times three calls only.
    """
    timer = timeit.Timer(fn)
    number = 3 if repeat == 1 else timer.autorange()[0]
    return min(timer.repeat(repeat=repeat, number=number)) / number


def survivors(n: int, f: int, seed: int = 0) -> tuple[int, ...]:
    """A seeded random set of f of the n workers (:func:`~gradcode.common.codes.numerics.survivor_sets`)."""
    return tuple(survivor_sets(n, f, random_sets=1, seed=seed, contiguous=False)[0])


def time_coefficients(n: int, repeat: int) -> dict[str, Any]:
    """Time every method of getting the decoding coefficients for one survivor set of n = f + n/5."""
    s = max(1, n // 5)
    f = n - s
    rows = survivors(n, f)
    b_matrix = encoding_matrix(n, n, s + 1)
    # Columns scaled to unit norm: the same system up to a diagonal scaling, without the overflow the
    # raw entries (~1e160 at n = 1280) would cause inside LAPACK; the arithmetic timed is the same.
    b_matrix = b_matrix / np.abs(b_matrix).max(axis=0)
    b_matrix /= np.linalg.norm(b_matrix, axis=0)
    lstsq_matrix = np.ascontiguousarray(b_matrix[list(rows)].T)
    ones = np.ones(n, dtype=np.complex128)
    points = np.exp(2j * np.pi * np.asarray(rows) / n)
    vandermonde_t = np.ascontiguousarray(np.vander(points, f, increasing=True).T)
    unit = np.zeros(f, dtype=np.complex128)
    unit[0] = 1.0
    code = ReedSolomonCode(n, n, s + 1, max_decode_error=math.inf)

    def online() -> Decoding:
        decoder = code.decoder()
        for r in rows:
            decoder.add(r)
        return decoder.decoding()

    methods: dict[str, Callable[[], object]] = {
        "rs_fast": lambda: decoding_weights(n, rows),
        "rs_alg3": lambda: decoding_weights_algorithm3(n, rows),
        "rs_online": online,
        "lstsq": lambda: np.linalg.lstsq(lstsq_matrix, ones, rcond=None),
        "lu": lambda: np.linalg.solve(vandermonde_t, unit),
    }
    times = {name: best_time(fn, repeat) for name, fn in methods.items()}
    return {
        "n": n,
        "s": s,
        "f": f,
        **{f"{name}_s": t for name, t in times.items()},
        "speedup_vs_lstsq": times["lstsq"] / times["rs_fast"],
        "speedup_vs_lu": times["lu"] / times["rs_fast"],
        "speedup_vs_alg3": times["rs_alg3"] / times["rs_fast"],
    }


def time_combine(p: int, f: int, repeat: int) -> dict[str, Any]:
    """Time ``Decoding.combine`` over f complex128 messages of length p against copying the same bytes."""
    rng = np.random.default_rng(1)
    messages = {i: rng.standard_normal(p) + 1j * rng.standard_normal(p) for i in range(f)}
    weights = rng.standard_normal(f) + 1j * rng.standard_normal(f)
    decoding = Decoding(tuple(range(f)), weights)
    copies = {i: np.empty_like(m) for i, m in messages.items()}

    def copy_all() -> None:
        for i, m in messages.items():
            np.copyto(copies[i], m)

    combine_s = best_time(lambda: decoding.combine(messages), repeat)
    copy_s = best_time(copy_all, repeat)
    nbytes = f * p * 16
    return {
        "p": p,
        "f": f,
        "bytes": nbytes,
        "combine_s": combine_s,
        "copy_s": copy_s,
        "combine_GBps": nbytes / combine_s / 1e9,
        "copy_GBps": nbytes / copy_s / 1e9,
        "ratio": copy_s / combine_s,
    }


def _format_coefficients(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'n':>5} {'f':>5} {'rs_fast':>10} {'rs_alg3':>10} {'rs_online':>10} {'lstsq':>10} {'lu':>10}"
        f" {'x lstsq':>8} {'x lu':>7} {'x alg3':>7}"
    )
    lines = ["Decoding coefficients (seconds per call)", head]
    for r in rows:
        lines.append(
            f"{r['n']:>5} {r['f']:>5} {r['rs_fast_s']:>10.2e} {r['rs_alg3_s']:>10.2e} {r['rs_online_s']:>10.2e}"
            f" {r['lstsq_s']:>10.2e} {r['lu_s']:>10.2e} {r['speedup_vs_lstsq']:>8.1f} {r['speedup_vs_lu']:>7.1f}"
            f" {r['speedup_vs_alg3']:>7.1f}"
        )
    return "\n".join(lines)


def _format_combine(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "Combine sum a_i m_i (complex128 messages) vs numpy copy of the same bytes",
        f"{'p':>9} {'f':>5} {'MB':>8} {'combine GB/s':>13} {'copy GB/s':>10} {'ratio':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['p']:>9} {r['f']:>5} {r['bytes'] / 1e6:>8.1f} {r['combine_GBps']:>13.2f} {r['copy_GBps']:>10.2f}"
            f" {r['ratio']:>6.2f}"
        )
    return "\n".join(lines)


def _plot(coefficients: Sequence[dict[str, Any]], combine: Sequence[dict[str, Any]], path: Path) -> None:
    with figure(path, 1, 2, figsize=(12, 4.5), dpi=120) as (left, right):
        fs = [r["f"] for r in coefficients]
        for key, label in [
            ("rs_fast", "RS closed form O(f·s)"),
            ("rs_alg3", "RS Algorithm 3 O(f²)"),
            ("rs_online", "RS online decoder (adds + weights)"),
            ("lstsq", "numpy lstsq"),
            ("lu", "numpy solve (LU)"),
        ]:
            left.loglog(fs, [r[f"{key}_s"] for r in coefficients], marker="o", label=label)
        left.set_xlabel("f (workers decoded from), s = n/5")
        left.set_ylabel("seconds per decoding vector")
        left.set_title("Decoding coefficients")
        left.grid(True, which="both", alpha=0.3)
        left.legend(fontsize=8)
        labels = [f"p={r['p']:.0e}\nf={r['f']}" for r in combine]
        right.bar(range(len(combine)), [r["ratio"] for r in combine], color="tab:blue")
        right.axhline(TARGET_COMBINE_RATIO, color="tab:red", linestyle="--", label="target 0.6")
        right.set_xticks(range(len(combine)), labels, fontsize=7)
        right.set_ylabel("copy time / combine time")
        right.set_title("Combine vs memory copy of the same bytes")
        right.legend(fontsize=8)


def run(*, quick: bool = False, out: Path = RESULTS) -> dict[str, Any]:
    """Run the benchmark, print the tables, save JSON and PNG under ``out``; return the results."""
    sizes = QUICK_SIZES if quick else FULL_SIZES
    combine_cases = QUICK_COMBINE if quick else FULL_COMBINE
    repeat = 1 if quick else 5
    coefficients = [time_coefficients(n, repeat) for n in sizes]
    combine = [
        time_combine(p, f, 1 if quick else 3) for p, fs in combine_cases for f in fs if f * p * 16 <= MAX_COMBINE_BYTES
    ]
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "numpy": np.__version__,
        },
        "quick": quick,
        "coefficients": coefficients,
        "combine": combine,
        "targets": {
            "speedup_vs_lstsq": TARGET_SPEEDUP_VS_LSTSQ,
            "combine_ratio": TARGET_COMBINE_RATIO,
            "lstsq_met_for_f": [r["f"] for r in coefficients if r["speedup_vs_lstsq"] >= TARGET_SPEEDUP_VS_LSTSQ],
            "lu_met_for_f": [r["f"] for r in coefficients if r["speedup_vs_lu"] > 1.0],
            "combine_met": [(r["p"], r["f"]) for r in combine if r["ratio"] >= TARGET_COMBINE_RATIO],
        },
    }
    print(_format_coefficients(coefficients))
    print()
    print(_format_combine(combine))
    save(results, out, "decode", lambda path: _plot(coefficients, combine, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    quick = "tiny sizes, one repeat: a smoke run of a few seconds"
    quick_or_full_main("decode", __doc__, quick=quick, run=run, argv=argv)


if __name__ == "__main__":
    main()
