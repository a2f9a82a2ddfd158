"""What a user types wrong gets one line saying what to do, never a traceback; the defaults are safe and shown.

These run the CLI in-process (argument errors and local files need no master); the ones that need a real
master are in tests/e2e/test_operator_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradcode.client.__main__ import _spec_from_args, build_parser, main
from gradcode.common.codes.registry import make_code
from gradcode.common.sim.stragglers import FixedDelay

UNREACHABLE = "127.0.0.1:9"
"""A master address nothing listens at (discard port): a test that reaches it has gone too far."""


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and standard error of `gradcode ARGV` (argparse's usage errors exit 2 through SystemExit)."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", ["missing", "directory", "text", "npz"])
def test_initial_parameters_that_are_not_a_npy_file_are_a_usage_error(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"missing": tmp_path / "nope.npy", "text": tmp_path / "p.txt", "npz": tmp_path / "p.npz"}
    path = files.get(kind, tmp_path)
    if kind == "text":
        path.write_text("0.1 0.2 0.3\n")
    if kind == "npz":
        np.savez(path, a=np.zeros(3))
    status, line = _fails(["run", "--master", UNREACHABLE, "--initial-parameters", str(path)], capsys)
    assert status == 2
    assert line.startswith("gradcode run: error: argument --initial-parameters:") and str(path) in line
    assert "pickle" not in line  # numpy's advice to unpickle an untrusted file is not ours to give
    expected = {"missing": "No such file", "directory": "Is a directory", "text": "not a .npy", "npz": ".npz archive"}
    assert expected[kind] in line


def test_initial_parameters_from_a_npy_file_reach_the_spec(tmp_path: Path) -> None:
    np.save(tmp_path / "p.npy", np.arange(4.0))
    args = build_parser().parse_args(["run", "--initial-parameters", str(tmp_path / "p.npy")])
    assert _spec_from_args(args).initial_parameters.shape == [4]


def test_a_missing_checkpoint_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, line = _fails(["resume", "--master", UNREACHABLE, "--checkpoint", str(tmp_path / "x.ckpt.npz")], capsys)
    assert status == 2 and "argument --checkpoint:" in line and "no such file" in line


@pytest.mark.parametrize("command", ["run", "watch JOB", "model JOB"])
def test_an_output_that_cannot_be_written_fails_at_once_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "sub" / ("m.npy" if command.startswith("model") else "run")
    status, line = _fails([*command.split(), "--master", UNREACHABLE, "--out", str(out)], capsys)
    assert status == 1
    assert line.startswith(f"gradcode: cannot write to {blocker / 'sub'}")
    assert "Not a directory" in line and "nothing answered" not in line  # refused before any call


def test_an_unknown_scheme_lists_the_valid_ones_without_a_quoted_repr(capsys: pytest.CaptureFixture[str]) -> None:
    status, line = _fails(["run", "--master", UNREACHABLE, "--scheme", "foo"], capsys)
    assert status == 2
    assert "unknown scheme 'foo'; valid schemes: binary," in line and "cyclic" in line and '"' not in line


def test_a_text_value_for_a_numeric_code_parameter_is_named_before_a_missing_one() -> None:
    """`--code-param n=abc` reaches make_code (on the master) as {"n": "abc"}: say n, not that s is missing."""
    with pytest.raises(ValueError, match=r"parameter 'n' must be an integer, not 'abc'"):
        make_code("cyclic", n="abc")
    with pytest.raises(ValueError, match=r"parameter 'max_decode_error' must be a number, not 'tiny'"):
        make_code("cyclic", n=4, s=1, max_decode_error="tiny")
    assert make_code("cyclic", n=4, s=1).n == 4


def test_a_straggler_count_in_fixed_mode_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"'count' \(2\) applies only with every_iteration_random=true"):
        FixedDelay(0.1, count=2)
    with pytest.raises(ValueError, match=r"'count' \(1\) applies only"):
        FixedDelay(0.1, workers=[0], count=1)
    assert FixedDelay(0.1, random_worker=True, num_workers=4, count=2).stragglers(3).__len__() == 2
    assert FixedDelay(0.1, random_worker=True, num_workers=4).count == 1  # the default, in its own mode
    assert "count" not in repr(FixedDelay(0.1, workers=[1]))


def test_run_help_shows_the_training_defaults_and_the_output_directory(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--optimizer {gd,nesterov} (default: nesterov)",
        "step size (default: 0.5)",
        "(default: 0.0001)",
        "gradient steps (default: 60)",
        "the model and the code (default: 0)",
        "(default: runs/latest)",
        "--wait-for-workers SECONDS",
        "(default: binary, exact for any n and s < n)",
    ):
        assert shown in text, shown


def test_the_default_scheme_is_certified_for_every_n_and_s() -> None:
    """`gradcode run --n N --s S` with no --scheme must plan for any s < n (cyclic was refused at n=16, s=2)."""
    parser = build_parser()
    for n in range(1, 21):
        for s in range(n):
            spec = _spec_from_args(parser.parse_args(["run", "--n", str(n), "--s", str(s)]))
            assert spec.code.name == "binary" and spec.code.params["n"] == n and spec.code.params["s"] == s
