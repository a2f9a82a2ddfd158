"""Model plugins: discovery through the ``gradcode.models`` entry-point group, and the errors that name what is there.

Third-party plugins are real distributions: each test writes a ``*.dist-info`` directory (METADATA +
entry_points.txt) and a module beside it into a temporary directory on ``sys.path``, which is what
``pip install`` leaves behind, so ``importlib.metadata`` finds them exactly as it finds installed ones.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import gradcode
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import (
    MODEL_KINDS,
    LinearRegression,
    SoftmaxRegression,
    available_models,
    make_model,
)
from gradcode.common.training.plugins import MODEL_ENTRY_POINT_GROUP, PluginError, _load, model_plugins

PLUGIN_MODULE = """
from gradcode.common.training.models import SoftmaxRegression


class ScaledSoftmax(SoftmaxRegression):
    kind = "scaled_softmax"


def build(*, num_features, num_classes, dtype):
    return ScaledSoftmax(num_features, num_classes)


def not_a_model(*, num_features, num_classes, dtype):
    return "a string"


def refuses(*, num_features, num_classes, dtype):
    raise ValueError("needs 3 features")


NOT_CALLABLE = 42
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path where tests 'install' distributions; the plugin cache is cleared around each test."""
    (tmp_path / "fake_gradcode_plugin.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    _load.cache_clear()
    yield tmp_path
    _load.cache_clear()
    sys.modules.pop("fake_gradcode_plugin", None)


def install(site: Path, dist: str, entry_points: dict[str, str]) -> None:
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{MODEL_ENTRY_POINT_GROUP}]\n{lines}\n")


def test_builtins_then_installed_plugins_are_available() -> None:
    names = available_models()
    assert names[:3] == list(MODEL_KINDS)
    assert {"digits_mlp", "digits_cnn"} <= set(names[3:])  # gradcode's own example plugins
    assert gradcode.available_models() == names and gradcode.make_model is make_model


def test_unknown_model_is_refused_listing_what_is_available() -> None:
    expected = f"Unknown model kind 'resnet'; valid kinds are {available_models()}"
    with pytest.raises(PluginError, match=re.escape(expected)):
        make_model("resnet", num_features=4)


def test_third_party_plugin_is_found_and_builds_a_model(site: Path) -> None:
    install(site, "fake-plugin", {"scaled_softmax": "fake_gradcode_plugin:build"})
    assert model_plugins()["scaled_softmax"] == "fake_gradcode_plugin:build"
    assert "scaled_softmax" in available_models()
    model = make_model("scaled_softmax", num_features=64, num_classes=10)
    builtin = SoftmaxRegression(64, 10)
    data = load_dataset("digits", seed=0)
    params = np.random.default_rng(0).standard_normal(builtin.num_params)
    assert type(model).__name__ == "ScaledSoftmax"
    np.testing.assert_array_equal(
        model.gradient(params, data.X_train, data.y_train), builtin.gradient(params, data.X_train, data.y_train)
    )


def test_plugin_may_not_shadow_a_builtin(site: Path) -> None:
    install(site, "shadow", {"softmax": "fake_gradcode_plugin:build"})
    assert "softmax" not in model_plugins()
    assert type(make_model("softmax", num_features=3, num_classes=3)) is SoftmaxRegression


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("fake_gradcode_plugin:not_a_model", "built str, not a gradcode Model"),
        ("fake_gradcode_plugin:refuses", "refused num_features=4, num_classes=2, dtype=float64: needs 3 features"),
        ("fake_gradcode_plugin:NOT_CALLABLE", "is not callable; it must be a model factory"),
        ("no_such_module_anywhere:build", "failed to load: ModuleNotFoundError"),
    ],
)
def test_broken_plugins_are_refused_by_name(site: Path, target: str, message: str) -> None:
    install(site, "broken", {"broken_model": target})
    with pytest.raises(PluginError, match=re.escape("Model plugin 'broken_model' ")) as info:
        make_model("broken_model", num_features=4)
    assert message in str(info.value)


def test_a_name_two_distributions_register_is_ambiguous(site: Path) -> None:
    install(site, "first", {"twice": "fake_gradcode_plugin:build"})
    install(site, "second", {"twice": "fake_gradcode_plugin:build"})
    with pytest.raises(PluginError, match="'twice' is registered more than once"):
        make_model("twice", num_features=4)


def test_dtype_must_be_float64_or_float32() -> None:
    assert make_model("softmax", num_features=3, num_classes=3, dtype=np.float32).dtype == np.float64  # numpy built-in
    with pytest.raises(ValueError, match="'dtype' must be float64 or float32, not 'int8'"):
        make_model("softmax", num_features=3, num_classes=3, dtype="int8")


def test_statistics_are_summed_loss_and_score_and_add_up_over_partitions() -> None:
    data = load_dataset("digits", seed=0)
    model = SoftmaxRegression(data.num_features, data.num_classes)
    params = np.random.default_rng(1).standard_normal(model.num_params) * 0.1
    stats = model.statistics(params, data.X_train, data.y_train)
    correct = np.count_nonzero(model.predict(params, data.X_train) == data.y_train)
    assert stats[0] == pytest.approx(model.loss(params, data.X_train, data.y_train), rel=1e-15)
    assert stats[1] == correct
    halves = [model.statistics(params, data.X_train[s], data.y_train[s]) for s in (slice(0, 500), slice(500, None))]
    np.testing.assert_allclose(halves[0] + halves[1], stats, rtol=1e-12)
    linear = LinearRegression(2)
    X, y = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, 3.0])
    assert linear.statistics(np.zeros(3), X, y).tolist() == [5.0, 10.0]  # loss 1/2 RSS, score RSS


def test_export_writes_the_parameters(tmp_path: Path) -> None:
    model = SoftmaxRegression(3, 2)
    params = np.arange(model.num_params, dtype=np.float64)
    assert model.export(params, tmp_path / "model") == [tmp_path / "model.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "model.npy"), params)
