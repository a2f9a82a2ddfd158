"""``gradcode.v1``, from this folder (pyproject's package-dir). Under any other name (``import protos.gradcode.v1`` at a
checkout's root) it would be a second copy of every module and class, failing isinstance against the first."""

if __name__ != "gradcode.v1":
    raise ImportError(f"import gradcode.v1, not {__name__}")
