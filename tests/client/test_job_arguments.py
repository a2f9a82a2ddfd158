"""`gradcode run` and build_job_spec carry the dataset's test fraction, options and mode into the JobSpec."""

from __future__ import annotations

import pytest

from gradcode.client.__main__ import _spec_from_args, build_parser
from gradcode.client.history import format_summary
from gradcode.client.sdk import build_job_spec
from gradcode.v1 import master_pb2


def test_run_exposes_the_test_fraction() -> None:
    args = build_parser().parse_args(["run", "--scheme", "cyclic", "--n", "4", "--s", "1", "--test-fraction", "0.35"])
    assert _spec_from_args(args).dataset.test_fraction == pytest.approx(0.35)
    default = build_parser().parse_args(["run"])
    assert _spec_from_args(default).dataset.test_fraction == 0.0  # the master's default applies


def test_run_chooses_worker_local_data_with_options() -> None:
    argv = ["run", "--worker-data", "--dataset", "file", "--dataset-path", "X.npy", "--dataset-option", "labels=y.npy"]
    dataset = _spec_from_args(build_parser().parse_args(argv)).dataset
    assert dataset.worker_local and dataset.path == "X.npy" and dict(dataset.options) == {"labels": "y.npy"}
    assert not _spec_from_args(build_parser().parse_args(["run"])).dataset.worker_local  # the master streams
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--dataset-option", "labels"])


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_build_job_spec_refuses_a_test_fraction_outside_0_1(bad: float) -> None:
    with pytest.raises(ValueError, match=r"test_fraction must be in \[0, 1\)"):
        build_job_spec(scheme="cyclic", n=4, s=1, test_fraction=bad)


def test_bench_subcommand_passes_the_rest_to_the_benchmark() -> None:
    args = build_parser().parse_args(["bench", "training", "--quick", "--out", "/tmp/x"])
    assert args.benchmark == "training" and args.bench_args == ["--quick", "--out", "/tmp/x"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "no-such-benchmark"])


def test_run_sizes_a_generated_dataset_and_chooses_the_surplus_mode() -> None:
    argv = ["run", "--dataset", "linear", "--model", "linear", "--samples", "600", "--features", "1000000"]
    spec = _spec_from_args(build_parser().parse_args([*argv, "--surplus", "hold"]))
    assert (spec.dataset.num_samples, spec.dataset.num_features, spec.surplus) == (600, 10**6, "hold")
    default = _spec_from_args(build_parser().parse_args(["run"]))
    assert (default.dataset.num_samples, default.dataset.num_features, default.surplus) == (0, 0, "")
    for bad in (["--samples", "-1"], ["--features", "many"], ["--surplus", "pull"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", *bad])


def test_run_chooses_how_the_model_reaches_the_workers() -> None:
    spec = _spec_from_args(build_parser().parse_args(["run", "--model-delivery", "relay"]))
    assert spec.model_delivery == "relay"
    assert _spec_from_args(build_parser().parse_args(["run"])).model_delivery == ""  # the master's default
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--model-delivery", "broadcast"])


def test_the_run_summary_gives_the_masters_bytes_per_iteration() -> None:
    reports = [
        master_pb2.IterationReport(iteration=t, wall_seconds=0.1, exact=True, bytes_received=r, bytes_sent=4_800_000)
        for t, r in enumerate((2_400_000, 2_500_000, 9_000_000))
    ]
    assert format_summary("fractional", reports).endswith("; master received/sent 2.5/4.8 MB per iteration (median)")


def test_the_run_summary_gives_the_start_slack_of_the_rounds_that_held_backups() -> None:
    reports = [
        master_pb2.IterationReport(iteration=t, wall_seconds=0.1, exact=True, start_slack_seconds=slack)
        for t, slack in enumerate((0.0, 0.003, 0.021, 0.040))
    ]
    assert format_summary("fractional", reports).endswith(
        "; held backups waited 21.0 ms past the expected workers' beginnings (median of 3 rounds)"
    )  # the round that held none does not count


def test_uncoded_runs_without_s_and_an_explicit_s_for_it_is_refused() -> None:
    uncoded = _spec_from_args(build_parser().parse_args(["run", "--scheme", "uncoded", "--n", "4"]))
    assert uncoded.code.name == "uncoded"
    coded = _spec_from_args(build_parser().parse_args(["run", "--scheme", "cyclic", "--n", "4"]))
    assert dict(coded.code.params)["s"] == 2  # the default for a scheme that tolerates stragglers
    with pytest.raises(ValueError, match=r"The uncoded scheme tolerates no straggler \(s = 0\), not s = 2"):
        _spec_from_args(build_parser().parse_args(["run", "--scheme", "uncoded", "--n", "4", "--s", "2"]))
