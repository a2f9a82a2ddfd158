"""``gradcode simulate``: the table, the JSON file, costs from a file with flags on top, refusals in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.client.__main__ import main


def test_simulate_prints_one_row_per_configuration_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"compute_seconds": 4.0, "message_overhead": 0.5}))
    out = tmp_path / "rows.json"
    argv = ["simulate", "--scheme", "uncoded", "fractional", "--n", "4", "--s", "0", "1", "--costs", str(costs)]
    argv += ["--compute-seconds", "1", "--straggler", "fixed", "--straggler-param", "delay_seconds=10"]
    argv += ["--straggler-param", "workers=[2]", "--iterations", "3", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "skipped uncoded n=4 s=1" in printed
    rows = {(r["scheme"], r["parameters"]): r for r in json.loads(out.read_text())["rows"]}
    # the flag's compute_seconds (1) wins over the file's (4); the file's overhead stays
    assert rows[("uncoded", "n=4")]["median_seconds"] == pytest.approx(10.25 + 0.5)
    assert rows[("fractional", "n=4 s=1")]["median_seconds"] == pytest.approx(0.5 + 2 * 0.5)  # two rows needed
    assert rows[("fractional", "n=4 s=1")]["total_seconds"] == pytest.approx(3 * 1.5)
    assert len(rows) == 3 and "10750.00" in printed


def test_simulate_refuses_bad_costs_and_parameters_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"compute": 1}))
    assert main(["simulate", "--costs", str(bad)]) == 1
    assert "Unknown cost field(s) ['compute']" in capsys.readouterr().err
    assert main(["simulate", "--scheme", "binary", "fractional", "--code-param", "n=4"]) == 1
    assert "exactly one --scheme" in capsys.readouterr().err
    assert main(["simulate", "--iterations", "0"]) == 1
    assert main(["simulate", "--straggler", "pareto", "--straggler-param", "shape=0"]) == 1
    assert "shape" in capsys.readouterr().err


def test_simulate_holds_the_backups_messages_when_asked(tmp_path: Path) -> None:
    """The held backups of tests/common/test_simulate.py from the command line: pushed 4 s and 3 messages, held 3 s
    and 2 (expected worker 1 delayed 10 s)."""
    argv = ["simulate", "--scheme", "fractional", "--n", "4", "--s", "1", "--compute-seconds", "2", "--no-broadcast"]
    argv += ["--message-bytes", "1", "--master-bandwidth", "1", "--straggler", "fixed"]
    argv += ["--straggler-param", "delay_seconds=10", "--straggler-param", "workers=[1]", "--iterations", "1"]
    seen = {}
    for surplus in ("push", "hold"):
        out = tmp_path / f"{surplus}.json"
        assert main([*argv, "--surplus", surplus, "--json", str(out)]) == 0
        (row,) = json.loads(out.read_text())["rows"]
        seen[surplus] = (row["median_seconds"], row["master_bytes_per_iteration"])
    assert seen == {"push": (4.0, 3.0), "hold": (3.0, 2.0)}
    with pytest.raises(SystemExit):  # argparse: not a choice
        main([*argv, "--surplus", "auto"])
