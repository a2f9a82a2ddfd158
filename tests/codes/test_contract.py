"""The contract every registered scheme meets, checked exhaustively for n <= 10.

For every valid small configuration and every subset of workers (all of each worker's messages,
fed in a random order): a set the decoder calls decodable decodes to the true gradient within the
tolerance of :func:`tolerance_for`; a set it refuses really cannot be decoded (independent rank
check); any ``n - s`` workers always suffice; duplicates and unknown rows are handled as documented.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gradcode.common.codes import GradientCode, available_codes, code_class, make_code
from gradcode.common.codes.numerics import decode_error, ones_in_span
from gradcode.common.exceptions import NotDecodableError
from tests.codes.conftest import tolerance_for

MAX_N = 10
QUICK_MAX_N = 7
"""Configurations up to this n form the quick loop; larger ones are marked slow (CI runs them all)."""
SEED = 20161205


def _configs() -> list[pytest.param]:  # type: ignore[valid-type]
    params = []
    for name in available_codes():
        for cfg in code_class(name).small_configs(MAX_N):
            ident = name + "-" + "-".join(f"{k}{v}" for k, v in cfg.items())
            marks = [pytest.mark.slow] if int(cfg.get("n", 0)) > QUICK_MAX_N else []
            params.append(pytest.param(name, cfg, id=ident, marks=marks))
    return params


CONFIGS = _configs()


def _check_every_subset(code: GradientCode, rng: np.random.Generator) -> None:
    assignment = code.assign(None)
    tol = tolerance_for(code)
    n = code.n
    for size in range(n + 1):
        for workers in itertools.combinations(range(n), size):
            rows = assignment.rows_of(workers)
            order = list(rng.permutation(rows)) if rows else []
            decoder = code.decoder(assignment)
            for r in order:
                decoder.add(int(r))
            if not code.exact:
                assert decoder.decodable == (size >= n - code.s), (workers, code)
                if decoder.decodable:
                    assert decoder.decoding().exact is False
                continue
            if decoder.decodable:
                err = decode_error(code, [int(r) for r in order], assignment=assignment, rng=rng)
                assert err <= tol, f"{code}: workers {workers} decode with relative error {err:.3g} > {tol}"
                assert decoder.decoding().exact, f"{code}: an exact code flagged workers {workers} approximate"
            else:
                assert not ones_in_span(code.B[rows]), f"{code}: decodable workers {workers} refused"
                with pytest.raises(NotDecodableError):
                    decoder.decoding()
            if size >= n - code.s:
                assert decoder.decodable, f"{code}: {size} >= n - s workers {workers} not decodable"


@pytest.mark.parametrize(("name", "cfg"), CONFIGS)
def test_every_arrival_set(name: str, cfg: dict[str, int]) -> None:
    code = make_code(name, **cfg)
    _check_every_subset(code, np.random.default_rng(SEED))


@pytest.mark.parametrize("name", available_codes())
def test_duplicates_are_ignored_and_unknown_rows_refused(name: str) -> None:
    cfg = next(iter(code_class(name).small_configs(MAX_N)))
    code = make_code(name, **cfg)
    assignment = code.assign(None)
    decoder = code.decoder(assignment)
    first = assignment.rows[0][0]
    decoder.add(first)
    decoder.add(first)
    assert decoder.received == (first,)
    with pytest.raises(KeyError, match="not part of this iteration"):
        decoder.add(10**6)


@pytest.mark.parametrize("name", available_codes())
def test_unknown_parameters_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="does not take parameter"):
        make_code(name, n=4, no_such_parameter=1)


def test_registry_names_every_scheme() -> None:
    with pytest.raises(KeyError, match="available"):
        make_code("no_such_scheme", n=3)
