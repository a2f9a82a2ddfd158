"""How long does a round take to choose whom to expect? ``GradientCode.decoding_set`` as shipped, against decoding
again without each member (its minimisation before it solved by the span, and still its fallback).

    python -m gradcode.bench.primaries [--quick] [--out DIR]

For every flat scheme that builds at n in {16, 64, 200} and the cheaper ones at n = 2000 (:data:`LARGE_SCHEMES`;
s = 1, or 0 for uncoded), on one seeded random
preference: *choose*, the set a round expects (:class:`~gradcode.common.gather.primaries.Primaries`), and
*complete*, the set completing the messages of half the workers (a promotion,
:class:`~gradcode.master.hedging.Hedging`). Each is timed as shipped and by decoding again, alternately, over a few
repeats (medians); the second is not run above n = 200, where it takes seconds to minutes (52 s for clustered at
n = 2000). The master calls it on its event loop, so its time is a stall of every job's round.

Prints a table and saves ``primaries.json`` and ``primaries.png`` in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.output import RESULTS, figure, load_average, quick_or_full_main, save
from gradcode.common.codes.base import Assignment, GradientCode
from gradcode.common.codes.registry import available_codes, code_class

FULL_SIZES = (16, 64, 200, 2000)
QUICK_SIZES = (16, 64)
LARGEST_FOR_ALL = 200
DECODING_AGAIN_UP_TO = 200
"""Largest n at which the decode-per-member minimisation is timed too."""
LARGE_SCHEMES = ("binary", "binary_heterogeneous", "clustered", "dynamic_clustered", "fractional", "uncoded")
"""The schemes timed above :data:`LARGEST_FOR_ALL` workers: the others' guards refuse or take minutes to build
them there (cyclic, Reed–Solomon, CodedReduce, partial stragglers), and ignore_stragglers, approximate, always
decodes again (12 ms at n = 200, seconds at 2000)."""
SEED = 7


def _decoding_again(
    code: GradientCode, assignment: Assignment, preference: Sequence[int], given: Sequence[int]
) -> list[int] | None:
    """``decoding_set`` as it was before the span's solves (and still is where it falls back): the greedy prefix,
    then a decode without each member."""
    greedy = code._greedy_prefix(assignment, preference, given)
    return code._minimal_by_decoding(assignment, greedy, given) if greedy else greedy


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def time_case(code: GradientCode, repeats: int) -> dict[str, Any]:
    """Median seconds of both minimisations for *choose* and *complete* on ``code`` (None: not run)."""
    assignment = code.static_assignment()
    order = [int(w) for w in np.random.default_rng(SEED).permutation(code.n)]
    cases = {"choose": ((), order), "complete": (order[: code.n // 2], order[code.n // 2 :])}
    row: dict[str, Any] = {"scheme": code.name, "n": code.n, "s": code.s}
    for case, (given, preference) in cases.items():
        found = code.decoding_set(assignment, preference, given=given)
        row[f"{case}_set"] = None if found is None else len(found)
        as_shipped = functools.partial(code.decoding_set, assignment, preference, given=given)
        decoding_again = functools.partial(_decoding_again, code, assignment, preference, given)
        shipped: list[float] = []
        again: list[float] = []
        for _ in range(repeats):  # alternately, so that both see the same machine
            shipped.append(_timed(as_shipped))
            if found and code.n <= DECODING_AGAIN_UP_TO:
                again.append(_timed(decoding_again))
        row[f"{case}_shipped_s"] = statistics.median(shipped)
        row[f"{case}_decoding_again_s"] = statistics.median(again) if again else None
    return row


def _codes(sizes: Sequence[int]) -> list[GradientCode]:
    codes = []
    for name in sorted(available_codes()):
        for n in sizes:
            if n > LARGEST_FOR_ALL and name not in LARGE_SCHEMES:
                continue
            for s in (1, 0):  # (0: uncoded)
                try:
                    code = code_class(name).for_stragglers(n, s)
                except ValueError:  # (no configuration at this n and s, or refused by its numerical guard)
                    continue
                if code.topology() is None:
                    codes.append(code)
                break
    return codes


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def _format(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "decoding_set: ms as shipped, and decoding again without each member (—: not run above n = 200)",
        f"{'scheme':<22} {'n':>5} {'s':>2} {'set':>5} {'choose':>9} {'again':>9} {'complete':>9} {'again':>9}",
    ]
    for r in rows:
        lines.append(
            f"{r['scheme']:<22} {r['n']:>5} {r['s']:>2} {r['choose_set']!s:>5} {_ms(r['choose_shipped_s']):>9}"
            f" {_ms(r['choose_decoding_again_s']):>9} {_ms(r['complete_shipped_s']):>9}"
            f" {_ms(r['complete_decoding_again_s']):>9}"
        )
    return "\n".join(lines)


def _plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    from matplotlib import colormaps

    with figure(path, figsize=(8, 5), dpi=120) as ax:
        palette = colormaps["tab20"]
        for i, scheme in enumerate(sorted({r["scheme"] for r in rows})):
            mine = [r for r in rows if r["scheme"] == scheme]
            color = palette(2 * i % 20 + (2 * i // 20))
            ax.loglog(
                [r["n"] for r in mine], [r["choose_shipped_s"] for r in mine], marker="o", color=color, label=scheme
            )
            again = [r for r in mine if r["choose_decoding_again_s"] is not None]
            ax.loglog([r["n"] for r in again], [r["choose_decoding_again_s"] for r in again], ls="--", color=color)
        ax.set_xlabel("workers n")
        ax.set_ylabel("seconds to choose the expected set")
        ax.set_title("decoding_set as shipped (solid) and decoding again without each member (dashed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)


def run(*, quick: bool = False, out: Path = RESULTS) -> dict[str, Any]:
    """Time every case, print the table, save JSON and PNG under ``out``; return the results."""
    load_before = load_average()
    rows = [time_case(code, 1 if quick else 5) for code in _codes(QUICK_SIZES if quick else FULL_SIZES)]
    load_after = load_average()
    results: dict[str, Any] = {"quick": quick, "load_before": load_before, "load_after": load_after, "rows": rows}
    print(_format(rows))
    print(f"1-minute load: {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    save(results, out, "primaries", lambda path: _plot(rows, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    quick = "n = 16 and 64, one repeat: a smoke run of seconds"
    quick_or_full_main("primaries", __doc__, quick=quick, run=run, argv=argv)


if __name__ == "__main__":
    main()
