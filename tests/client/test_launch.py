"""ServiceProcess: a child that never announces its address is reported with its output, and nothing of it is left
open (its pipe and log would otherwise surface later, in another test, as an unraisable ResourceWarning)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gradcode.client.launch import ServiceProcess


def test_a_child_that_never_listens_is_reported_with_its_output_and_closed(tmp_path: Path) -> None:
    process = ServiceProcess([sys.executable, "-c", "print('cannot bind: port in use')"], log_path=tmp_path / "c.log")
    with pytest.raises(RuntimeError, match="did not start within 5 s; its output:\ncannot bind: port in use"):
        process.wait_ready(5.0)
    assert not process.alive
    assert process.process.stdout is not None and process.process.stdout.closed
    assert process._log.closed
