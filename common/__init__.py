"""``gradcode.common``, from this folder (pyproject's package-dir). Under any other name (``import common`` at a
checkout's root) it would be a second copy of every module and class, failing isinstance against the first."""

if __name__ != "gradcode.common":
    raise ImportError(f"import gradcode.common, not {__name__}")
