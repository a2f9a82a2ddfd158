"""Shared fixtures and helpers for the gradient-code contract suite."""

from __future__ import annotations

import numpy as np

from gradcode.common.codes import GradientCode

EXACT_BINARY_TOLERANCE = 1e-12
"""Relative decode error allowed for codes whose B and weights are 0/1 (float64 sums only)."""
EXACT_REAL_TOLERANCE = 1e-9
"""Relative decode error allowed for real- and complex-valued codes (float64)."""


def tolerance_for(code: GradientCode) -> float:
    """The error bound the issue sets for this code: 1e-12 for 0/1 matrices, 1e-9 otherwise."""
    values = np.unique(code.B)
    return EXACT_BINARY_TOLERANCE if set(values.tolist()) <= {0.0, 1.0} else EXACT_REAL_TOLERANCE
