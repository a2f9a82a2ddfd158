"""Gradient codes: one abstraction (:class:`GradientCode`), one module per scheme, a registry by name.

Choose a scheme by name with :func:`make_code` (``available_codes()`` lists them); the classes are
exported for direct use and for their scheme-specific attributes.
"""

from gradcode.common.codes.base import (
    Assignment,
    Decoding,
    GradientCode,
    Observation,
    OnlineDecoder,
    SpanDecoder,
    SpanTracker,
)
from gradcode.common.codes.baseline import IgnoreStragglers, Uncoded
from gradcode.common.codes.binary import BinaryCode, HeterogeneousBinaryCode
from gradcode.common.codes.clustered import ClusteredCode, DynamicClusteredCode
from gradcode.common.codes.coded_reduce import CodedReduceCode, CodedReduceTree, CompAllocCode
from gradcode.common.codes.consistency import ConsistencyReport, check_consistency, decode_excluding
from gradcode.common.codes.cyclic import CyclicRepetitionCode
from gradcode.common.codes.fractional import FractionalRepetitionCode
from gradcode.common.codes.numerics import ErrorCertificate, relative_error
from gradcode.common.codes.partial import PartialStragglerCode
from gradcode.common.codes.reed_solomon import ReedSolomonCode
from gradcode.common.codes.registry import available_codes, code_class, code_parameters, make_code, register

__all__ = [
    "Assignment",
    "BinaryCode",
    "ClusteredCode",
    "CodedReduceCode",
    "CodedReduceTree",
    "CompAllocCode",
    "ConsistencyReport",
    "CyclicRepetitionCode",
    "Decoding",
    "DynamicClusteredCode",
    "ErrorCertificate",
    "FractionalRepetitionCode",
    "GradientCode",
    "HeterogeneousBinaryCode",
    "IgnoreStragglers",
    "Observation",
    "OnlineDecoder",
    "PartialStragglerCode",
    "ReedSolomonCode",
    "SpanDecoder",
    "SpanTracker",
    "Uncoded",
    "available_codes",
    "check_consistency",
    "code_class",
    "code_parameters",
    "decode_excluding",
    "make_code",
    "register",
    "relative_error",
]
