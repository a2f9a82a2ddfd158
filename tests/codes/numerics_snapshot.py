"""Snapshot of what the numerics decide: every scheme's B (accepted draws, refusals) and its decodes.

``python -m tests.codes.numerics_snapshot`` writes ``tests/codes/fixtures/numerics_snapshot-<kernel>-<release>.json``
for the OpenBLAS kernel and release numpy runs here (:func:`blas_kernel`, :func:`openblas_version`). Each was
generated from the code *before* the numerics were merged into one home (issue 7, commit 9b404f2), and
``test_numerics_snapshot.py`` checks that the current code still produces the same matrices bit for bit (sha256
of ``B``), the same accepted draw indices and refusals, and the same decodings (rows, exactness flag, weights to
rounding level) on contiguous and seeded random survivor sets.

Why one file per kernel and release: the randomly drawn codes (cyclic, partial stragglers, CodedReduce) go
through LAPACK, whose kernels for different CPUs round differently in the last bits, so their matrices (and near
a guard's bound, their accepted draws and refusals) differ between an AVX-512 machine (``SkylakeX``) and an AVX2
one (``Haswell``, also what AMD EPYC runs). Releases differ the same way: on the Haswell kernel, OpenBLAS 0.3.34
(numpy 2.5's) gives 5 other cyclic matrices, refuses one more draw and measures errors up to 3x apart from 0.3.31
(numpy 2.4's). The Haswell files were written by the old code on this project's machine and reproduce byte for
byte; the SkylakeX one was written on an AVX-512 machine whose release was not recorded (0.3.31, the project's
environment of that day, is inferred).

Issue 24 made every guard certify its limit (:func:`~gradcode.common.codes.numerics.worst_guard_certificate`), which
changes accepted draws and refusals by design: the SkylakeX 0.3.31 file was regenerated then, with this module, on
an AVX-512 machine with OpenBLAS 0.3.31; the Haswell files predate it and must be regenerated on a Haswell machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

from gradcode.common.codes import GradientCode, make_code
from gradcode.common.exceptions import NumericallyUnsafeError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SIZES = (3, 5, 8, 12, 17, 24, 33, 48, 64)
SEEDS = (0, 1, 2)
RANDOM_SETS = 3
WEIGHTS_KEPT = 12


def blas_kernel() -> str:
    """The OpenBLAS kernel numpy's linear algebra runs on this CPU (e.g. ``Haswell``, ``SkylakeX``); the name
    of the BLAS when it is not OpenBLAS."""
    kernels = _openblas("architecture")
    if kernels:
        return "+".join(kernels)
    return "+".join(sorted({str(lib.get("internal_api")) for lib in threadpool_info()})) or "unknown"


def openblas_version() -> str:
    """The release of the OpenBLAS numpy runs on (e.g. ``0.3.31``); ``none`` when it is not OpenBLAS."""
    return "+".join(".".join(v.split(".")[:3]) for v in _openblas("version")) or "none"


def _openblas(key: str) -> list[str]:
    """``key`` of each OpenBLAS loaded in this process (numpy's, loaded when it is imported), sorted."""
    return sorted({str(lib.get(key)) for lib in threadpool_info() if lib.get("internal_api") == "openblas"})


def fixture_path(kernel: str, release: str) -> Path:
    return FIXTURES / f"numerics_snapshot-{kernel}-{release}.json"


def _stragglers(n: int) -> list[int]:
    return sorted({s for s in (1, 2, n // 4, n // 2, n - 2) if 0 < s < n})


def configurations() -> Iterator[tuple[str, dict[str, Any]]]:
    """(scheme, parameters) over the grid of (n, s, seed); seedless schemes once per (n, s)."""
    for n in SIZES:
        for s in _stragglers(n):
            for seed in SEEDS:
                yield "cyclic", {"n": n, "s": s, "seed": seed}
                if n <= 33:
                    yield "partial_stragglers", {"n": n, "s": s, "seed": seed}
                if n <= 24:
                    yield "coded_reduce", {"n": n, "s": s, "L": 1, "seed": seed}
            yield "binary", {"n": n, "s": s}
            yield "binary_heterogeneous", {"n1": (n + 1) // 2, "n2": n // 2, "s": s}
            yield "ignore_stragglers", {"n": n, "s": s}
            if n % (s + 1) == 0:
                yield "fractional", {"n": n, "s": s}
            if n >= 2 and n <= 48:
                yield "reed_solomon", {"n": n, "k": n, "w": s + 1}
    for n in (4, 6, 8):
        yield "coded_reduce", {"n": n, "s": 1, "L": 2, "seed": 3}
    for n in (8, 12, 24, 48, 64):
        for clusters in (d for d in range(2, n) if n % d == 0 and n // d >= 2):
            for load in sorted({2, n // clusters}):
                for seed in SEEDS[:2]:
                    yield "clustered", {"n": n, "clusters": clusters, "load": load, "seed": seed}
                    yield "dynamic_clustered", {"n": n, "clusters": clusters, "load": load, "seed": seed}
    yield "uncoded", {"n": 5}
    # Near the acceptance boundary: tight bounds make the guards redraw and refuse, so a change in how
    # the decode error is measured would show up as a different accepted draw or refusal here.
    for n in (12, 17, 24, 33):
        for s in _stragglers(n):
            for bound in (1e-12, 1e-13):
                yield "cyclic", {"n": n, "s": s, "seed": 0, "max_decode_error": bound}
    for n in (6, 10, 16, 24, 32):
        for s in (1, 2, n // 4):
            for bound in (1e-11, 1e-13):
                yield "reed_solomon", {"n": n, "k": n, "w": s + 1, "max_decode_error": bound}


def _floats(values: np.ndarray) -> dict[str, list[float]]:
    """Weights to 13 significant digits (the test compares them to rounding level, not bit for bit)."""
    values = np.asarray(values)
    out = {"re": [float(f"{v:.13g}") for v in values.real.ravel()]}
    if np.iscomplexobj(values):
        out["im"] = [float(f"{v:.13g}") for v in values.imag.ravel()]
    return out


def _survivor_sets(code: GradientCode, seed: int) -> list[list[int]]:
    n, f = code.n, code.n - code.s
    rng = np.random.default_rng([seed, n, code.s])
    sets = [[(start + i) % n for i in range(f)] for start in range(0, n, max(1, n // 2))]
    sets += [sorted(int(w) for w in rng.choice(n, size=f, replace=False)) for _ in range(RANDOM_SETS)]
    return sets


def snapshot_one(name: str, params: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"scheme": name, "params": params}
    # A cyclic code's guard at the job's tolerance (max_certified_error=inf: it certifies max_decode_error), not at
    # the 1e-12 promise (issue 10), which refuses most of the grid.
    built = {"max_certified_error": math.inf, **params} if name == "cyclic" else params
    try:
        code = make_code(name, **built)
    except NumericallyUnsafeError as exc:
        entry["refused"] = True
        entry["measured_error"] = exc.measured_error
        return entry
    except ValueError as exc:
        entry["invalid"] = str(exc)
        return entry
    b = np.ascontiguousarray(code.B)
    entry["shape"] = list(b.shape)
    entry["dtype"] = str(b.dtype)
    entry["sha256"] = hashlib.sha256(b.tobytes()).hexdigest()
    for attribute in ("draw", "measured_decode_error"):
        value = getattr(code, attribute, None)
        if value is not None:
            entry[attribute] = value
    assignment = code.static_assignment()
    decodes = []
    for workers in _survivor_sets(code, 0):
        rows = assignment.rows_of(workers)
        decoding = code.decode(rows, assignment)
        weights = np.asarray(decoding.weights)
        # Small codes keep every weight; larger ones two summaries (keeps the fixture small).
        summary = weights if weights.size <= WEIGHTS_KEPT else np.array([np.abs(weights).sum(), weights.sum()])
        decodes.append({"workers": workers, "rows": list(decoding.rows), "exact": decoding.exact, **_floats(summary)})
    entry["decodes"] = decodes
    return entry


def snapshot() -> list[dict[str, Any]]:
    return [snapshot_one(name, params) for name, params in configurations()]


def main() -> int:
    entries = snapshot()
    fixture = fixture_path(blas_kernel(), openblas_version())
    fixture.parent.mkdir(parents=True, exist_ok=True)
    fixture.write_text(json.dumps(entries, separators=(",", ":")) + "\n")
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["scheme"]] = counts.get(e["scheme"], 0) + 1
    refused = sum(1 for e in entries if e.get("refused"))
    redrawn = sum(1 for e in entries if e.get("draw", 0) > 0)
    print(f"{fixture.name}: {len(entries)} configurations ({refused} refused, {redrawn} redrawn)", file=sys.stderr)
    print(counts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
