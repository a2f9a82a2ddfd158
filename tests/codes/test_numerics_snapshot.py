"""The numerics decide the same things as before they were merged into one home (issue 7).

The fixture (one per OpenBLAS kernel and release: LAPACK's last bits differ between them, see
:mod:`tests.codes.numerics_snapshot`) was written by ``python -m tests.codes.numerics_snapshot`` from the code
before the merge:
every registered scheme over a grid of (n, s, seed), plus cyclic and Reed–Solomon codes with bounds
tight enough that their guards redraw and refuse. The current code must produce bit-identical
matrices (so the same accepted draws), the same refusals, and the same decodings. The cyclic guard's
measured errors are bit-identical; Reed–Solomon's differ at rounding level only (see below).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.codes.numerics_snapshot import blas_kernel, fixture_path, openblas_version, snapshot_one

KERNEL, RELEASE = blas_kernel(), openblas_version()
FIXTURE = fixture_path(KERNEL, RELEASE)
ENTRIES = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else []

pytestmark = pytest.mark.skipif(
    not ENTRIES,
    reason=f"no numerics snapshot for the BLAS kernel {KERNEL!r} and OpenBLAS {RELEASE} of this machine "
    f"({FIXTURE.name} is missing): "
    "write it with `python -m tests.codes.numerics_snapshot` run at commit 9b404f2 (the code before the merge, "
    "which names it numerics_snapshot.json)",
)


def _ident(entry: dict[str, object]) -> str:
    params = entry["params"]
    assert isinstance(params, dict)
    return f"{entry['scheme']}-" + "-".join(f"{k}{v}" for k, v in params.items())


def test_fixture_covers_every_scheme_redraws_and_refusals() -> None:
    from gradcode.common.codes import available_codes

    assert {e["scheme"] for e in ENTRIES} == set(available_codes())
    assert sum(1 for e in ENTRIES if e.get("draw", 0) > 0) >= 10
    assert sum(1 for e in ENTRIES if e.get("refused")) >= 10


QUICK_SAMPLE = 8
"""The quick loop (``-m "not slow"``) checks every 8th configuration; CI checks them all."""


@pytest.mark.parametrize(
    "before",
    [
        pytest.param(e, id=_ident(e), marks=[] if i % QUICK_SAMPLE == 0 else [pytest.mark.slow])
        for i, e in enumerate(ENTRIES)
    ],
)
def test_same_matrices_draws_refusals_and_decodes(before: dict[str, object]) -> None:
    params = dict(before["params"])  # type: ignore[call-overload]
    # (snapshot_one builds a cyclic code at the job's tolerance, max_certified_error=inf, as it was written.)
    now = snapshot_one(str(before["scheme"]), params)
    for key in ("refused", "invalid", "shape", "dtype", "sha256", "draw"):
        assert now.get(key) == before.get(key), key
    for key in ("measured_error", "measured_decode_error"):
        if before.get(key) is not None:
            if before["scheme"] == "reed_solomon":
                # The guard used to combine with a matrix product; it now measures the production
                # combine (Decoding.combine) on the same gradients: equal up to rounding noise.
                assert before[key] / 2 <= now[key] <= before[key] * 2, key
            else:  # the cyclic guard's arithmetic is unchanged, bit for bit
                assert now[key] == before[key], key
    for old, new in zip(before.get("decodes", []), now.get("decodes", []), strict=True):  # type: ignore[call-overload]
        # A decoding now lists its rows ascending (Decoding.in_row_order); the fixture has them in arrival order.
        # Larger codes keep two order-free summaries of the weights instead of every weight.
        order = np.argsort(old["rows"], kind="stable")
        assert (new["workers"], new["rows"], new["exact"]) == (old["workers"], sorted(old["rows"]), old["exact"])
        for part in ("re", "im"):
            if part in old:
                want, got = np.array(old[part]), np.array(new[part])
                if want.size == order.size:
                    want = want[order]
                scale = max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * scale)
