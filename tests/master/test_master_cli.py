"""The master's command line: the --shared-memory and --max-features flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradcode.common.transport.shared_memory import DEFAULT_ROOT
from gradcode.master.__main__ import parse_arguments, shared_memory_root
from gradcode.master.limits import MAX_FEATURES


def test_shared_memory_is_a_directory_or_off(tmp_path: Path) -> None:
    assert shared_memory_root("off") is None
    assert shared_memory_root(str(tmp_path)) == tmp_path
    assert parse_arguments(["--shared-memory", str(tmp_path)]).shared_memory_root == tmp_path
    default = parse_arguments([]).shared_memory_root
    assert default == (DEFAULT_ROOT if DEFAULT_ROOT.is_dir() else None)  # no /dev/shm: simply not offered


def test_a_missing_shared_memory_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="is not a directory; give a tmpfs directory, or 'off'"):
        shared_memory_root(str(missing))
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["--shared-memory", str(missing)])
    assert exit_info.value.code == 2
    assert "--shared-memory" in capsys.readouterr().err


def test_max_features_defaults_to_the_cap_and_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_arguments([]).max_features == MAX_FEATURES == 100_000
    assert parse_arguments(["--max-features", "1000000"]).max_features == 10**6
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["--max-features", "0"])
    assert exit_info.value.code == 2 and "--max-features must be >= 1, not 0" in capsys.readouterr().err
