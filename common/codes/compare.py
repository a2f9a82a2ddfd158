"""The scheme comparison table: what each registered scheme costs and how exact it is for (n, s).

The first thing a user reads to choose a scheme: per-worker load (fraction of the data each worker
stores and processes), messages per worker, the decoder's cost class, and the worst relative decode
error measured over adversarial (contiguous) and random survivor sets of ``n - s`` workers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.numerics import survivor_sets, worst_decode_error
from gradcode.common.codes.registry import available_codes, code_class, make_code
from gradcode.common.exceptions import NumericallyUnsafeError

__all__ = ["GUARDED_SCHEMES", "SchemeRow", "accepted_table", "format_table", "scheme_rows"]


@dataclass(frozen=True)
class SchemeRow:
    """One line of the comparison table; ``note`` explains a scheme that has no configuration."""

    scheme: str
    params: str = ""
    tolerates: int = 0
    load: float = math.nan
    messages_per_worker: float = math.nan
    decode_cost: str = ""
    worst_error: float = math.nan
    exact: bool = True
    note: str = ""


def _row(name: str, code: GradientCode) -> SchemeRow:
    assignment = code.static_assignment()
    load = max(code.data_share(w) for w in range(code.n))
    per_worker = float(np.mean([len(rows) for rows in assignment.rows]))
    error = math.nan
    if code.exact:
        error = worst_decode_error(code, survivor_sets(code.n, code.n - code.s))
    params = ", ".join(f"{k}={v}" for k, v in code._params().items())
    return SchemeRow(name, params, code.s, load, per_worker, code.decode_cost, error, code.exact)


def scheme_rows(n: int, s: int) -> list[SchemeRow]:
    """One row per registered scheme, configured by its ``for_stragglers(n, s)``.

    The uncoded baseline (which tolerates no straggler) comes first, as the reference.
    """
    rows = [_row("uncoded", code_class("uncoded")(n=n))]  # type: ignore[call-arg]
    for name in available_codes():
        if name == "uncoded":
            continue
        try:
            code = code_class(name).for_stragglers(n, s)
        except ValueError as exc:  # includes NumericallyUnsafeError
            rows.append(SchemeRow(name, note=str(exc)))
            continue
        rows.append(_row(name, code))
    return rows


def format_table(rows: list[SchemeRow], n: int, s: int) -> str:
    """Render the rows as an aligned text table, with refusals listed underneath."""
    header = ("scheme", "parameters", "tolerates", "load", "msgs/worker", "worst rel. error", "decoder cost")
    body = []
    notes = []
    for r in rows:
        if r.note:
            body.append((r.scheme, "-", "-", "-", "-", "not available (see below)", "-"))
            notes.append(f"  {r.scheme}: {r.note}")
            continue
        err = f"{r.worst_error:.1e}" if r.exact else "approximate"
        body.append(
            (r.scheme, r.params, str(r.tolerates), f"{r.load:.3f}", f"{r.messages_per_worker:g}", err, r.decode_cost)
        )
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    lines = [f"Gradient codes for n = {n} workers tolerating s = {s} stragglers (load = fraction of data per worker)"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) for line in body]
    if notes:
        lines += ["", "Not available for these parameters:", *notes]
    return "\n".join(lines)


GUARDED_SCHEMES: dict[str, Callable[[int, int], GradientCode]] = {
    "cyclic": lambda n, s: make_code("cyclic", n=n, s=s),
    "cyclic (1e-9)": lambda n, s: make_code("cyclic", n=n, s=s, max_certified_error=math.inf),
    "reed_solomon": lambda n, s: make_code("reed_solomon", n=n, k=n, w=s + 1),
}
"""The schemes whose construction guard refuses configurations, as ``gradcode codes --accepted`` builds them:
``cyclic`` at its default promise (certified 1e-12), ``cyclic`` certifying the job's tolerance only
(``max_certified_error=inf``: 1e-9), ``reed_solomon`` with ``k = n``, ``w = s + 1``."""


def _stragglers(n: int) -> list[int]:
    return sorted({s for s in (1, 2, 3, n // 4, n // 2, n - 1) if 0 < s < n})


def accepted_table(sizes: Sequence[int], *, progress: Callable[[str], None] | None = None) -> str:
    """A Markdown table of which ``(n, s)`` each guarded scheme accepts, built by the code itself.

    A cell is the guard's certificate of the accepted code (the largest relative bound its honest decodes can
    carry, :func:`~gradcode.common.codes.numerics.worst_guard_certificate`) or ``refused (X)`` with the number the
    refusal reports; ``s`` runs over 1, 2, 3, n/4, n/2, n - 1. Refusals at n = 128 take seconds each (every
    draw is certified), so the whole table takes minutes.
    """
    lines = ["| scheme | n | " + " | ".join(["s: guard certificate (or refused)"]) + " |", "|---|---|---|"]
    for name, build in GUARDED_SCHEMES.items():
        for n in sizes:
            cells = []
            for s in _stragglers(n):
                started = time.perf_counter()
                try:
                    code = build(n, s)
                except NumericallyUnsafeError as exc:
                    cells.append(f"{s}: refused ({exc.measured_error:.1e})")
                except ValueError:
                    continue
                else:
                    certified = getattr(code, "certified_decode_error", None)
                    cells.append(f"{s}: {certified:.1e}" if certified is not None else f"{s}: accepted")
                if progress is not None:
                    progress(f"{name} n={n} s={s}: {cells[-1]} ({time.perf_counter() - started:.1f} s)")
            lines.append(f"| `{name}` | {n} | {'; '.join(cells)} |")
    return "\n".join(lines)
