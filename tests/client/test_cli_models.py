"""The CLI and SDK side of model plugins: naming a plugin, choosing float32, exporting a trained model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradcode.client.__main__ import _spec_from_args, build_parser, export_model
from gradcode.client.sdk import build_job_spec
from gradcode.common.training.models import make_model
from gradcode.v1 import common_pb2


def test_run_names_a_plugin_and_float32_messages() -> None:
    args = build_parser().parse_args(["run", "--model", "digits_mlp", "--dtype", "float32", "--n", "6", "--s", "2"])
    spec = _spec_from_args(args)
    assert spec.model.kind == "digits_mlp" and spec.message_dtype == common_pb2.DTYPE_FLOAT32
    default = _spec_from_args(build_parser().parse_args(["run"]))
    assert default.model.kind == "softmax" and default.message_dtype == common_pb2.DTYPE_UNSPECIFIED


def test_build_job_spec_refuses_an_unknown_message_dtype() -> None:
    with pytest.raises(ValueError, match=r"message_dtype must be one of \['float64', 'float32', 'complex128'\]"):
        build_job_spec(scheme="cyclic", n=6, s=2, message_dtype="float16")


def test_export_writes_a_state_dict_for_a_torch_plugin(tmp_path: Path) -> None:
    spec = build_job_spec(scheme="cyclic", n=6, s=2, model="digits_cnn", message_dtype="float32")
    spec.model.num_features, spec.model.num_classes = 64, 10
    params = make_model("digits_cnn", num_features=64, num_classes=10, dtype=np.float32).init_params()
    files = export_model(spec, params, tmp_path / "cnn")
    assert files == [tmp_path / "cnn.npy", tmp_path / "cnn.pt"]
    assert all(f.stat().st_size > 0 for f in files)


def test_export_without_the_plugin_writes_the_parameters_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = build_job_spec(scheme="cyclic", n=6, s=2, model="someone_elses_net")
    spec.model.num_features, spec.model.num_classes = 4, 3
    params = np.arange(5.0)
    assert export_model(spec, params, tmp_path / "net.npy") == [tmp_path / "net.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "net.npy"), params)
    assert "only the parameters are written: Unknown model kind 'someone_elses_net'" in capsys.readouterr().err
