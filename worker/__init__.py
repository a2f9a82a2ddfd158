"""``gradcode.worker``, from this folder (pyproject's package-dir). Under any other name (``import worker`` at a
checkout's root) it would be a second copy of every module and class, failing isinstance against the first."""

if __name__ != "gradcode.worker":
    raise ImportError(f"import gradcode.worker, not {__name__}")
