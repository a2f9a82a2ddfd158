"""``gradcode.master``, from this folder (pyproject's package-dir). Under any other name (``import master`` at a
checkout's root) it would be a second copy of every module and class, failing isinstance against the first."""

if __name__ != "gradcode.master":
    raise ImportError(f"import gradcode.master, not {__name__}")
