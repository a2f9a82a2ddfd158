"""The committed generated modules match a fresh `python -m protos.generate`."""

from protos.generate import drift


def test_generated_modules_are_not_stale() -> None:
    assert drift() == [], "run `python -m protos.generate` and commit the result"
