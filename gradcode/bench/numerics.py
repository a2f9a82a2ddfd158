"""How exact is each scheme as n grows? Worst relative decode error per scheme and n.

    python -m gradcode.bench.numerics [--sizes 8 16 32 64 128] [--straggler-fraction 0.25]

For each registered exact scheme and each n, builds the scheme's ``for_stragglers(n, s)`` with
``s = n * fraction`` rounded so that ``(s + 1) | n`` (so fractional repetition is comparable), and
measures the worst relative decode error (random float64 partial gradients) over the n cyclically
contiguous survivor sets — the adversarial case for Vandermonde-like systems — and 16 random ones.
A scheme whose construction-time guard refuses the configuration shows the error the guard measured,
so the table says *why* it refused. Prints a table and saves
``bench/results/numerics.json`` and ``bench/results/numerics.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gradcode.common.codes.numerics import DEFAULT_MAX_DECODE_ERROR, survivor_sets, worst_decode_error
from gradcode.common.codes.registry import available_codes, code_class
from gradcode.common.exceptions import NumericallyUnsafeError

RESULTS = Path(__file__).resolve().parent / "results"


def stragglers_for(n: int, fraction: float) -> int:
    """The largest s <= n * fraction (at least 1) with (s + 1) dividing n."""
    target = max(1, int(n * fraction))
    return max(s for s in range(1, target + 1) if n % (s + 1) == 0) if n >= 2 else 0


def measure(sizes: list[int], fraction: float) -> list[dict[str, Any]]:
    results = []
    for name in available_codes():
        cls = code_class(name)
        if not cls.exact:
            continue
        for n in sizes:
            s = stragglers_for(n, fraction)
            entry: dict[str, Any] = {"scheme": name, "n": n, "s": s, "error": None, "status": "ok"}
            try:
                code = cls.for_stragglers(n, s)
            except NumericallyUnsafeError as exc:
                entry["status"] = "refused by guard"
                entry["error"] = exc.measured_error
            except ValueError as exc:
                entry["status"] = f"n/a: {exc}"
            else:
                entry["error"] = worst_decode_error(code, survivor_sets(n, n - code.s))
            results.append(entry)
    return results


def render(results: list[dict[str, Any]], sizes: list[int]) -> str:
    schemes = sorted({r["scheme"] for r in results})
    by = {(r["scheme"], r["n"]): r for r in results}
    header = ["scheme"] + [f"n={n} (s={by[(schemes[0], n)]['s']})" for n in sizes]
    lines = []
    for name in schemes:
        cells = [name]
        for n in sizes:
            r = by[(name, n)]
            if r["error"] is None:
                cells.append("n/a")
            else:
                mark = " REFUSED" if r["status"] == "refused by guard" else ""
                cells.append(f"{r['error']:.1e}{mark}")
        lines.append(cells)
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    out.append(
        f"\nworst relative decode error over contiguous + 16 random survivor sets; bound {DEFAULT_MAX_DECODE_ERROR:g}; "
        "REFUSED = the construction-time guard refuses this configuration (the error it measured)"
    )
    return "\n".join(out)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in sorted({r["scheme"] for r in results}):
        pts = [(r["n"], max(r["error"], 1e-17)) for r in results if r["scheme"] == name and r["error"] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.axhline(DEFAULT_MAX_DECODE_ERROR, color="k", ls="--", lw=1, label="bound")
    ax.set(xscale="log", yscale="log", xlabel="workers n", ylabel="worst relative decode error")
    ax.set_xticks([r["n"] for r in results if r["scheme"] == results[0]["scheme"]])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--straggler-fraction", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = measure(args.sizes, args.straggler_fraction)
    print(render(results, args.sizes))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "numerics.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "numerics.png")
    print(f"saved {args.out / 'numerics.json'} and {args.out / 'numerics.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
