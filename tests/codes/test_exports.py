"""The public surface of gradcode.common.codes: sorted __all__, every name importable, every scheme exported."""

import gradcode.common.codes as codes
from gradcode.common.codes import GradientCode, available_codes, code_class


def test_all_is_sorted_and_importable() -> None:
    assert codes.__all__ == sorted(codes.__all__)
    for name in codes.__all__:
        assert hasattr(codes, name), name


def test_every_registered_scheme_is_exported() -> None:
    exported = {getattr(codes, n) for n in codes.__all__}
    for name in available_codes():
        cls = code_class(name)
        assert issubclass(cls, GradientCode)
        assert cls in exported, f"{cls.__name__} ({name!r}) is registered but not exported from gradcode.common.codes"
