"""A job's progress as `gradcode run`, `watch` and `demo` show it, on a terminal or in a log.

On a terminal: a live tqdm bar (loss, latest test accuracy, iteration time, late workers). Anywhere else
(a pipe, ``docker compose logs``, CI): tqdm's carriage returns never end a line, so the bar, the job id
and the summary ran together on one line; there a plain line is printed every tenth of the job instead.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from gradcode.v1 import master_pb2

__all__ = ["Progress"]

LINES_PER_JOB = 10
"""Progress lines a job prints when the output is not a terminal (plus its last iteration)."""


class Progress:
    """Progress of a job of ``total`` iterations, on ``stream`` (default: standard error).

    ``print_lines=False`` leaves non-terminal output to the caller (`gradcode watch` prints every iteration it shows).
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, print_lines: bool = True) -> None:
        self.label, self.total = label, total
        self.stream = sys.stderr if stream is None else stream
        self.print_lines = print_lines
        self.every = max(1, total // LINES_PER_JOB)
        self.accuracy = "-"
        """The latest evaluated test accuracy (the master evaluates every few iterations; NaN in between)."""
        self._bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="it", file=self.stream, dynamic_ncols=True)

    def update(self, r: master_pb2.IterationReport) -> None:
        """Show report ``r`` (its iteration number sets the position, so a resumed job's bar starts where it is)."""
        if not math.isnan(r.test_accuracy):
            self.accuracy = f"{r.test_accuracy:.3f}"
        late = len(r.late_workers) + len(r.failed_workers)
        if self._bar is not None:
            self._bar.update(max(0, min(int(r.iteration), self.total) - self._bar.n))
            self._bar.set_postfix(
                loss=f"{r.loss:.4f}", acc=self.accuracy, it=f"{r.wall_seconds * 1e3:.0f}ms", late=late, refresh=False
            )
        elif self.print_lines and (r.iteration % self.every == 0 or r.iteration >= self.total):
            print(
                f"{self.label}: iteration {r.iteration}/{self.total}, loss {r.loss:.4f}, test acc {self.accuracy}, "
                f"{r.wall_seconds * 1e3:.0f} ms, late {late}",
                file=self.stream, flush=True,
            )  # fmt: skip

    def write(self, line: str) -> None:
        """A line on standard output that does not tear the bar."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
