"""Session set-up shared by every test process of a run, the xdist workers included."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.helpers import PORTS_DIRECTORY_VARIABLE

_OWNED_DIRECTORY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The controller makes the run's port-reservation directory; xdist workers inherit it through the environment."""
    if PORTS_DIRECTORY_VARIABLE not in os.environ:
        os.environ[PORTS_DIRECTORY_VARIABLE] = tempfile.mkdtemp(prefix="gradcode-test-ports-")
        config.stash[_OWNED_DIRECTORY] = os.environ[PORTS_DIRECTORY_VARIABLE]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that made the directory removes it."""
    directory = config.stash.get(_OWNED_DIRECTORY, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(PORTS_DIRECTORY_VARIABLE, None)
