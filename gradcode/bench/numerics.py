"""How exact is each scheme as n grows? Measured decode errors beside their certified bounds.

    python -m gradcode.bench.numerics [--sizes 8 16 32 64 128] [--straggler-fraction 0.25]

For each registered exact scheme and each n, builds the scheme's ``for_stragglers(n, s)`` with
``s = n * fraction`` rounded so that ``(s + 1) | n`` (so fractional repetition is comparable), plus
``cyclic`` with its measured guard only (``max_certified_error=inf``, to show what the float64 promise
refuses). Each configuration is decoded on three kinds of survivor sets — the n cyclically contiguous
ones, 16 random ones, and 8 searched-adversarial ones (the worst straggler sets by
:func:`~gradcode.common.codes.numerics.adversarial_straggler_sets` for square one-row-per-worker codes,
otherwise the 8 of 64 random sets with the largest certificate) — with two kinds of partial
gradients: equal magnitudes, and magnitudes spread log-uniformly over six orders. Messages are the
workers' own ``encode``; the true error is against the correctly rounded sum (``math.fsum``); the
certified bound is :meth:`Decoding.certify` from the message norms. A configuration a guard refuses
shows the error the guard measured or certified, so the table says *why*. Prints a table and saves
``numerics.json`` and ``numerics.png`` in ``docs/results/`` (or ``--out``), with ``/proc/loadavg``. First it
prints what the certificate costs against the combine at p = 1e5 (:func:`certify_cost`; ``--cost-only``: just that).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.output import add_out_argument, figure, load_average, save
from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.numerics import (
    DEFAULT_MAX_DECODE_ERROR,
    EXACT_TOLERANCE,
    PROMISED_RELATIVE_ERROR,
    relative_error,
    survivor_sets,
)
from gradcode.common.codes.registry import available_codes, code_class, make_code
from gradcode.common.exceptions import NumericallyUnsafeError

COLUMNS = 32
SPREAD_ORDERS = 6.0
MEASURED_ONLY_CYCLIC = "cyclic[measured guard only]"


def stragglers_for(n: int, fraction: float) -> int:
    """The largest s <= n * fraction (at least 1) with (s + 1) dividing n."""
    target = max(1, int(n * fraction))
    return max(s for s in range(1, target + 1) if n % (s + 1) == 0) if n >= 2 else 0


def _decode(code: GradientCode, workers: list[int], g: np.ndarray) -> tuple[float, float]:
    """(true relative error, certified bound) of decoding ``workers`` on partial gradients ``g``."""
    assignment = code.static_assignment()
    decoding = code.decode(assignment.rows_of(workers), assignment)
    messages = {r: code.encode(r, {j: g[j] for j in code.support(r)}) for r in decoding.rows}
    combined, certificate = decoding.combine_certified(messages)
    want = np.array([math.fsum(g[:, c]) for c in range(g.shape[1])])
    return relative_error(combined, want), certificate.bound


def _set_kinds(code: GradientCode, rng: np.random.Generator) -> dict[str, list[list[int]]]:
    n, f = code.n, code.n - code.s
    kinds = {
        "contiguous": survivor_sets(n, f, random_sets=0, seed=rng),
        "random": survivor_sets(n, f, random_sets=16, seed=rng, contiguous=False),
    }
    if code.num_messages == n == code.k and 0 < code.s < n - 1:
        kinds["adversarial"] = survivor_sets(n, f, random_sets=0, seed=rng, contiguous=False, adversarial=code.B)
    else:  # searched by the certificate itself: the 8 worst of 64 random sets on equal-magnitude gradients
        pool = survivor_sets(n, f, random_sets=64, seed=rng, contiguous=False)
        g = rng.standard_normal((code.k, 4))
        kinds["adversarial"] = sorted(pool, key=lambda ws: _decode(code, ws, g)[1])[-8:]
    return kinds


def measure_code(code: GradientCode, seed: int = 0) -> dict[str, Any]:
    """Worst true error and worst certified bound per (set kind, magnitudes), and the bound/true ratios."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for kind, sets in _set_kinds(code, rng).items():
        for magnitudes, orders in (("equal", 0.0), ("spread", SPREAD_ORDERS)):
            worst_true = worst_bound = 0.0
            ratios = []
            for workers in sets:
                g = rng.standard_normal((code.k, COLUMNS)) * 10.0 ** rng.uniform(0, orders, size=(code.k, 1))
                true, bound = _decode(code, workers, g)
                worst_true, worst_bound = max(worst_true, true), max(worst_bound, bound)
                ratios.append(bound / max(true, np.finfo(np.float64).eps / 2))
            out[f"{kind}/{magnitudes}"] = {
                "true": worst_true,
                "certified": worst_bound,
                "min_ratio": float(min(ratios)),
                "max_ratio": float(max(ratios)),
                "sets": len(sets),
            }
    return out


def _configurations(sizes: list[int], fraction: float) -> list[tuple[str, int, int]]:
    names = [name for name in available_codes() if code_class(name).exact]
    return [(name, n, stragglers_for(n, fraction)) for name in [*names, MEASURED_ONLY_CYCLIC] for n in sizes]


def _build(name: str, n: int, s: int) -> GradientCode:
    if name == MEASURED_ONLY_CYCLIC:
        return make_code("cyclic", n=n, s=s, max_certified_error=math.inf)
    return code_class(name).for_stragglers(n, s)


def measure(sizes: list[int], fraction: float) -> list[dict[str, Any]]:
    results = []
    for name, n, s in _configurations(sizes, fraction):
        entry: dict[str, Any] = {"scheme": name, "n": n, "s": s, "error": None, "certified": None, "status": "ok"}
        try:
            code = _build(name, n, s)
        except NumericallyUnsafeError as exc:
            entry["status"] = "refused by guard"
            entry["error"] = exc.measured_error
            entry["reason"] = str(exc)
        except ValueError as exc:
            entry["status"] = f"n/a: {exc}"
        else:
            entry["kinds"] = measure_code(code)
            entry["error"] = max(v["true"] for v in entry["kinds"].values())
            entry["certified"] = max(v["certified"] for v in entry["kinds"].values())
            entry["max_ratio"] = max(v["max_ratio"] for v in entry["kinds"].values())
            entry["min_ratio"] = min(v["min_ratio"] for v in entry["kinds"].values())
        print(f"  {name} n={n} s={s}: {entry['status']} true={entry['error']} certified={entry['certified']}",
              flush=True)  # fmt: skip
        results.append(entry)
    return results


def render(results: list[dict[str, Any]], sizes: list[int]) -> str:
    schemes = list(dict.fromkeys(r["scheme"] for r in results))
    by = {(r["scheme"], r["n"]): r for r in results}
    header = ["scheme"] + [f"n={n} (s={by[(schemes[0], n)]['s']})" for n in sizes]
    lines = []
    for name in schemes:
        cells = [name]
        for n in sizes:
            r = by[(name, n)]
            if r["error"] is None:
                cells.append("n/a")
            elif r["status"] == "refused by guard":
                cells.append(f"REFUSED {r['error']:.0e}")
            else:
                cells.append(f"{r['error']:.0e} / {r['certified']:.0e}")
        lines.append(cells)
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    ratios = [r["max_ratio"] for r in results if r.get("max_ratio") is not None]
    floor = [r["min_ratio"] for r in results if r.get("min_ratio") is not None]
    out.append(
        "\ncells: worst true relative error / worst certified bound over contiguous, random and searched-adversarial "
        "survivor sets, equal and six-orders-spread partial-gradient magnitudes (float64)."
        f"\ncertified bound / true error (true floored at u): min {min(floor, default=math.nan):.2f}, "
        f"max {max(ratios, default=math.nan):.3g}. Promise: certified <= {PROMISED_RELATIVE_ERROR:g}; "
        f"measured guard bound {DEFAULT_MAX_DECODE_ERROR:g}."
        "\nREFUSED = a construction guard refuses this configuration (the error it measured or certified)."
    )
    return "\n".join(out)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    from matplotlib import colormaps
    from matplotlib.ticker import ScalarFormatter

    with figure(path, figsize=(8, 5), dpi=110) as ax:
        for index, name in enumerate(dict.fromkeys(r["scheme"] for r in results)):
            color = colormaps["tab20"](index % 20)
            ok = [r for r in results if r["scheme"] == name and r["certified"] is not None]
            if ok:
                ax.plot([r["n"] for r in ok], [max(r["error"], 1e-17) for r in ok], marker="o", color=color, label=name)
                ax.plot([r["n"] for r in ok], [r["certified"] for r in ok], ls=":", marker="^", color=color)
        ax.axhline(PROMISED_RELATIVE_ERROR, color="tab:red", ls="--", lw=1, label="promise (certified)")
        ax.axhline(DEFAULT_MAX_DECODE_ERROR, color="k", ls="--", lw=1, label="bound")
        ax.set(xscale="log", yscale="log", xlabel="workers n", ylabel="worst relative error: true (o) / certified (^)")
        ax.set_xticks([r["n"] for r in results if r["scheme"] == results[0]["scheme"]])
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


CERTIFY_COLUMNS = 100_000
CERTIFY_REPEATS = 15


def certify_cost(sizes: list[int], columns: int = CERTIFY_COLUMNS) -> list[dict[str, Any]]:
    """Seconds of the combine and of the certificate of one decode at ``p = columns``, per ``n`` (issue 24's target:
    the certificate at most 10% of the combine, amortized over a job).

    The code is ``cyclic`` with ``s = 1`` certifying the job's tolerance (real weights, every row of two partitions);
    the messages are Gaussian float64. ``certify`` is what :meth:`Round.decode` adds to the combine, as it does:
    :meth:`Decoding.error_bound` from the message norms (accumulated at ingest), magnitudes and sender errors before
    the combine, and :meth:`Decoding.certify_vector` (a lower bound of the combined vector's norm) after it.
    ``first`` includes the row profile, computed once per survivor set and weights of a job and cached
    (:func:`~gradcode.common.codes.base._cached_profile`); ``amortized`` is a later round's. The fastest of
    :data:`CERTIFY_REPEATS` runs (the least disturbed on a loaded machine)."""
    out = []
    for n in sizes:
        code = make_code("cyclic", n=n, s=1, max_certified_error=math.inf)
        rng = np.random.default_rng(n)
        decoding = code.decode(list(range(n - 1)))
        messages = {r: rng.standard_normal(columns) for r in decoding.rows}
        norms = [float(np.linalg.norm(messages[r])) for r in decoding.rows]
        magnitudes = [1.5 * v for v in norms]
        combine_times, certify_times = [], []
        first = math.nan
        for repeat in range(CERTIFY_REPEATS + 1):
            fresh = code.decode(list(range(n - 1)))  # a new round's decoding object, as the master makes
            started = time.perf_counter()
            bound = fresh.error_bound(norms, magnitudes=magnitudes, length=columns, sender_errors=[0.0] * len(norms))
            bounded_at = time.perf_counter()
            combined = fresh.combine(messages)
            combined_at = time.perf_counter()
            fresh.certify_vector(combined, bound, tolerance=EXACT_TOLERANCE, length=columns)
            certified_at = time.perf_counter()
            certifying = (bounded_at - started) + (certified_at - combined_at)
            if repeat == 0:
                first = certifying
                continue
            combine_times.append(combined_at - bounded_at)
            certify_times.append(certifying)
        combine, certify = min(combine_times), min(certify_times)  # the least disturbed run of a loaded machine
        out.append({"n": n, "p": columns, "combine_s": combine, "certify_first_s": first, "certify_s": certify,
                    "ratio": certify / combine})  # fmt: skip
        print(f"  n={n} p={columns}: combine {combine * 1e3:.2f} ms, certify {certify * 1e3:.3f} ms amortized "
              f"({first * 1e3:.2f} ms the first round of a survivor set): "
              f"{100 * certify / combine:.1f}% of the combine", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--straggler-fraction", type=float, default=0.25)
    add_out_argument(parser, "numerics")
    parser.add_argument("--cost-only", action="store_true", help="only the certificate's cost against the combine")
    args = parser.parse_args(argv)
    load_before = load_average()
    cost = certify_cost([n for n in args.sizes if n <= 128])
    results = [] if args.cost_only else measure(args.sizes, args.straggler_fraction)
    if results:
        print(render(results, args.sizes))
    load_after = load_average()
    print(f"/proc/loadavg before: {load_before}; after: {load_after}")
    if args.cost_only:
        return 0
    document = {"loadavg_before": load_before, "loadavg_after": load_after, "results": results, "certify_cost": cost}
    save(document, args.out, "numerics", lambda path: plot(results, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
