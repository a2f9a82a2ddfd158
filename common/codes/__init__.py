"""Gradient codes: one abstraction (:class:`GradientCode`), one module per scheme, a registry by name.

Choose a scheme by name with :func:`make_code` (``available_codes()`` lists them); the classes are
exported for direct use and for their scheme-specific attributes.
"""

from common.codes.base import (
    Assignment,
    Decoding,
    GradientCode,
    Observation,
    OnlineDecoder,
    SpanDecoder,
    SpanTracker,
)
from common.codes.baseline import IgnoreStragglers, Uncoded
from common.codes.binary import BinaryCode, HeterogeneousBinaryCode
from common.codes.clustered import ClusteredCode, DynamicClusteredCode
from common.codes.coded_reduce import CodedReduceCode, CodedReduceTree, CompAllocCode
from common.codes.cyclic import CyclicRepetitionCode
from common.codes.fractional import FractionalRepetitionCode
from common.codes.partial import PartialStragglerCode
from common.codes.reed_solomon import ReedSolomonCode
from common.codes.registry import available_codes, code_class, code_parameters, make_code, register

__all__ = [
    "Assignment",
    "BinaryCode",
    "ClusteredCode",
    "CodedReduceCode",
    "CodedReduceTree",
    "CompAllocCode",
    "CyclicRepetitionCode",
    "Decoding",
    "DynamicClusteredCode",
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
    "code_class",
    "code_parameters",
    "make_code",
    "register",
]
