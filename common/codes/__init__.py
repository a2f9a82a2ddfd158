"""Gradient codes: one abstraction (:class:`GradientCode`), one module per scheme, a registry by name."""

from common.codes.base import Assignment, Decoding, GradientCode, Observation, OnlineDecoder, SpanDecoder
from common.codes.baseline import IgnoreStragglers, Uncoded
from common.codes.registry import available_codes, code_class, code_parameters, make_code, register

__all__ = [
    "Assignment",
    "Decoding",
    "GradientCode",
    "IgnoreStragglers",
    "Observation",
    "OnlineDecoder",
    "SpanDecoder",
    "Uncoded",
    "available_codes",
    "code_class",
    "code_parameters",
    "make_code",
    "register",
]
