r"""Differentiable models whose loss is a SUM over samples, so partial gradients add up.

Gradient coding needs the full gradient to be the sum of per-partition gradients
(Tandon et al., §2: $g = \sum_j g_j$). Every model here therefore returns the *summed* loss and
gradient over the samples it is given, never the mean; the master divides by the number of training
samples (and adds L2 regularisation once) when it applies the optimizer step.

Parameters are one flat float64 vector of length :attr:`Model.num_params`, the layout the wire
protocol ships. Each model keeps an explicit bias (it does not append a ones column to ``X``):

* :class:`LinearRegression` — ``params = [w_1..w_p, b]``, loss $\tfrac12\|Xw + b - y\|^2$
  (CodedReduce's linear model, Reisizadeh et al. §VI eq. (10)).
* :class:`LogisticRegression` — ``params = [w_1..w_p, b]``, labels $\{0, 1\}$ (also $-1$ for the
  negative class), loss $\sum_i \log(1 + e^{-t_i z_i})$ with $t_i = \pm 1$, $z = Xw + b$
  (Tandon et al. §5).
* :class:`SoftmaxRegression` — ``params`` is the row-major $(p + 1) \times C$ matrix whose first $p$
  rows are the weights and whose last row is the bias; loss is the summed cross-entropy
  (Halbawi et al. §5, the MNIST experiment).

Training statistics travel with the gradient. :meth:`Model.gradient_and_statistics` returns
$[g, \ell, c]$: the summed gradient, the summed (unregularised) loss and the summed *score* of a
batch (the number of correct predictions for classifiers, the residual sum of squares for linear
regression). All three are sums over samples, so a worker's coded message $\sum_j b_j [g_j, \ell_j, c_j]$
decodes with the same coefficients as the gradient alone, and :func:`training_metrics` turns the
decoded vector into the mean training loss (plus the L2 term) and the training accuracy without the
master touching the data.

All computations are vectorised numpy in float64. The built-ins are linear predictors: outputs
$Z = XW + b$, a loss summed over the rows of $Z$, gradient $X^\top R$ and $\sum_i R_i$ with
$R = \partial\ell/\partial Z$ (:class:`LinearPredictor`). They stream a batch through row blocks of about
:data:`BLOCK_BYTES` of features: each block's forward product $X_b W$ and backward product $X_b^\top R_b$
read it from cache, so ``X`` crosses the memory bus once per gradient instead of twice — the whole cost
of these models once the data outgrows the cache. Besides the two products a block costs only its
$R_b$ and loss, and adding its $X_b^\top R_b$ into the gradient: a pass over the gradient that pays only when a
block holds several rows. Rows too wide for :data:`MIN_BLOCK_ROWS` of them in a block (about 65,000 features and
up) cannot stay in cache between the two products anyway, so such a batch goes in one block: two passes over
``X``, none over the gradient per row (at p = 10⁶, 16 rows: 12 ms against 56 ms with a block per row, where
numpy's product of a one-row block also takes a slow path; ``gradcode bench gradient``). The score is counted once
over the whole $Z$.

:class:`Model` is also the protocol a model plugin implements (see :mod:`gradcode.common.training.plugins`):
what the master and the workers call is its public surface — :attr:`~Model.num_params`,
:meth:`~Model.init_params`, :meth:`~Model.loss_and_gradient` (summed over the batch),
:meth:`~Model.statistics` (the counts a metric needs), :meth:`~Model.predict`,
:meth:`~Model.accuracy` and :meth:`~Model.export`. A subclass implements ``_evaluate`` and
``_predict`` on validated arrays, like the built-ins below. :func:`make_model` resolves the built-in
names first, then the installed plugins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from gradcode.common.validation import check_int

__all__ = [
    "MODEL_KINDS",
    "NUM_STATISTICS",
    "LinearPredictor",
    "LinearRegression",
    "LogisticRegression",
    "Model",
    "SoftmaxRegression",
    "TrainingMetrics",
    "available_models",
    "make_model",
    "message_length",
    "rows_per_block",
    "save_params",
    "training_metrics",
]

FloatArray = npt.NDArray[np.float64]

MODEL_KINDS = ("linear", "logistic", "softmax")
"""The built-in models' names; :func:`available_models` adds the installed plugins."""

MODEL_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
"""Floating types a model may compute in (float32 only for plugins that support it; see :func:`make_model`)."""

BLOCK_BYTES = 2 << 20
"""Feature bytes per row block of a built-in model's evaluation (see the module docstring)."""

MIN_BLOCK_ROWS = 4
"""Fewest rows a block must hold for blocking to pay (see the module docstring); below, the batch is one block."""

NUM_STATISTICS = 2
"""Coordinates :meth:`Model.gradient_and_statistics` appends to the gradient: summed loss, summed score."""


def _as_float_array(name: str, value: Any) -> FloatArray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric (convertible to float64): {exc}") from None


class Model(ABC):
    """A model with a summed loss, its gradient, predictions and a quality score.

    Attributes:
        kind: registry name (``"linear"``, ``"logistic"``, ``"softmax"`` or a plugin's name).
        num_features: number of input features $p$ (columns of ``X``).
        num_params: length of the flat parameter vector.
        dtype: the floating type the model computes in. Parameters, gradients and predictions cross
            the public methods as float64 whatever it is (a float32 model's values convert exactly).
    """

    kind: ClassVar[str]
    dtype: np.dtype[Any] = np.dtype(np.float64)

    def __init__(self, num_features: int, num_params: int) -> None:
        self.num_features = num_features
        self.num_params = num_params

    # ---- validation ----------------------------------------------------------------------------
    def _check_params(self, params: Any) -> FloatArray:
        p = _as_float_array("params", params)
        if p.shape != (self.num_params,):
            raise ValueError(
                f"params must be a flat vector of shape ({self.num_params},) for {self!r}, got shape {p.shape}."
            )
        return p

    def _check_features(self, X: Any) -> FloatArray:
        x = _as_float_array("X", X)
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"X must have shape (num_samples, {self.num_features}) for {self!r}, got shape {x.shape}.")
        return x

    def _check_features_labels(self, X: Any, y: Any) -> tuple[FloatArray, FloatArray]:
        x = self._check_features(X)
        labels = _as_float_array("y", y)
        if labels.shape != (x.shape[0],):
            raise ValueError(
                f"y must have shape ({x.shape[0]},) to match X's {x.shape[0]} samples, got shape {labels.shape}."
            )
        return x, self._check_labels(labels)

    def _check_labels(self, y: FloatArray) -> FloatArray:
        """Validate (and possibly normalise) labels; the default accepts any finite value."""
        return y

    # ---- public API ----------------------------------------------------------------------------
    def init_params(self) -> FloatArray:
        """The starting point of gradient descent: all zeros."""
        return np.zeros(self.num_params, dtype=np.float64)

    def loss(self, params: Any, X: Any, y: Any) -> float:
        """Summed loss over the samples of ``X``/``y`` (not the mean), so losses of a split add up."""
        return self.loss_and_gradient(params, X, y)[0]

    def gradient(self, params: Any, X: Any, y: Any) -> FloatArray:
        """Gradient of :meth:`loss` with respect to ``params``: float64, shape ``(num_params,)``."""
        return self.loss_and_gradient(params, X, y)[1]

    def loss_and_gradient(self, params: Any, X: Any, y: Any) -> tuple[float, FloatArray]:
        """Both the summed loss and its gradient, sharing one forward pass (what a worker needs)."""
        p = self._check_params(params)
        x, labels = self._check_features_labels(X, y)
        loss, grad, _ = self._evaluate(p, x, labels, score=False)
        return loss, grad

    def gradient_and_statistics(self, params: Any, X: Any, y: Any) -> FloatArray:
        """``[gradient, summed loss, summed score]`` of one batch, length ``num_params + NUM_STATISTICS``.

        The score is the number of correct predictions (classifiers) or the residual sum of squares
        (linear regression); like the loss it is unregularised and summed, so the vectors of disjoint
        batches add up to the vector of their union. One forward pass serves all three.
        """
        p = self._check_params(params)
        x, labels = self._check_features_labels(X, y)
        out = np.empty(self.num_params + NUM_STATISTICS, dtype=np.float64)
        out[self.num_params :] = self._evaluate_into(out[: self.num_params], p, x, labels)
        return out

    def accuracy_from_score(self, score: float, y: Any) -> float:
        """:meth:`accuracy` over the samples labelled ``y``, from their summed score.

        Classifiers: the correct-prediction count (rounded to the nearest integer: a decoded count
        carries floating-point error) over the number of samples.
        """
        labels = _as_float_array("y", y)
        if labels.size == 0:
            raise ValueError("accuracy needs at least one sample; y is empty.")
        return float(round(score)) / labels.size

    def predict(self, params: Any, X: Any) -> FloatArray:
        """Predicted class labels (classifiers) or values (linear regression), float64."""
        return self._predict(self._check_params(params), self._check_features(X))

    def accuracy(self, params: Any, X: Any, y: Any) -> float:
        """Fraction of correct predictions; :class:`LinearRegression` returns $R^2$ instead."""
        p = self._check_params(params)
        x, labels = self._check_features_labels(X, y)
        if x.shape[0] == 0:
            raise ValueError("accuracy needs at least one sample; X and y are empty.")
        return float(np.mean(self._predict(p, x) == self._class_targets(labels)))

    def statistics(self, params: Any, X: Any, y: Any) -> FloatArray:
        """``[summed loss, summed score]`` of a batch: what a metric needs, additive over partitions.

        The score is the number of correct predictions (classifiers) or the residual sum of squares
        (:class:`LinearRegression`); like the loss it is unregularised and summed, so the statistics of
        disjoint batches add up to those of their union.
        """
        p = self._check_params(params)
        x, labels = self._check_features_labels(X, y)
        loss, _, score = self._evaluate(p, x, labels, score=True)
        return np.array([loss, score], dtype=np.float64)

    def export(self, params: Any, path: str | Path) -> list[Path]:
        """Write ``params`` to ``path`` (``.npy``, float64) and return the files written.

        Models that have a native format write it beside (e.g. a torch ``state_dict``, see
        :class:`gradcode.contrib.torch_model.TorchModel`).
        """
        return save_params(self._check_params(params), path)

    def _class_targets(self, y: FloatArray) -> FloatArray:
        return y

    @abstractmethod
    def _evaluate(
        self, params: FloatArray, X: FloatArray, y: FloatArray, *, score: bool
    ) -> tuple[float, FloatArray, float]:
        """Summed loss, gradient and (when ``score``, else 0.0) summed score on already validated arrays."""

    def _evaluate_into(self, grad: FloatArray, params: FloatArray, X: FloatArray, y: FloatArray) -> tuple[float, float]:
        """:meth:`_evaluate` with its score, the gradient written into ``grad``; returns the loss and the score.
        A model that can compute straight into ``grad`` overrides it and saves the copy."""
        loss, gradient, score = self._evaluate(params, X, y, score=True)
        grad[:] = gradient
        return loss, score

    @abstractmethod
    def _predict(self, params: FloatArray, X: FloatArray) -> FloatArray:
        """Predictions on already validated arrays."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(num_features={self.num_features})>"


def rows_per_block(block_bytes: int, row_bytes: int, rows: int, min_rows: int = MIN_BLOCK_ROWS) -> int:
    """Rows per block of a batch of ``rows`` rows of ``row_bytes``: as many as ``block_bytes`` holds (at least one),
    or the whole batch (at least 1) when that is fewer than ``min_rows`` or ``block_bytes`` is 0. ``min_rows = 1``
    is the rule before :data:`MIN_BLOCK_ROWS` (``gradcode bench gradient`` times the two)."""
    step = max(1, block_bytes // max(1, row_bytes))
    return step if block_bytes and step >= min_rows else max(1, rows)


class LinearPredictor(Model):
    r"""A model whose outputs are $Z = XW + b$ and whose loss is a sum over the rows of $Z$.

    The gradient is $X^\top R$ for the weights and $\sum_i R_i$ for the bias, $R = \partial\ell/\partial Z$.
    :meth:`_evaluate` streams ``X`` through row blocks of :attr:`block_bytes` (see the module
    docstring); a subclass gives the weights (:meth:`_weights`), $R$ and the summed loss of a block
    (:meth:`_block_terms`) and the score of the whole $Z$ (:meth:`_score`).
    """

    block_bytes: ClassVar[int] = BLOCK_BYTES
    """Feature bytes per row block (0: the batch in one block)."""
    min_block_rows: ClassVar[int] = MIN_BLOCK_ROWS
    """Fewest rows per block; a batch whose blocks would hold fewer is one block (:func:`rows_per_block`)."""

    def _weights(self, params: FloatArray) -> tuple[FloatArray, FloatArray | float]:
        """$W$ and $b$ from ``params``: here ``[w, b]`` of a single output; models of several override it."""
        return params[:-1], float(params[-1])

    def _outputs(self, params: FloatArray, X: FloatArray) -> FloatArray:
        weights, bias = self._weights(params)
        out: FloatArray = X @ weights + bias
        return out

    @abstractmethod
    def _block_terms(self, z: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
        r"""$R = \partial\ell/\partial Z$ (a new array) and the summed loss of a block: outputs ``z``, labels ``y``."""

    @abstractmethod
    def _score(self, z: FloatArray, y: FloatArray, loss: float) -> float:
        """Summed score of the whole batch's outputs ``z`` (``loss`` is its summed loss)."""

    def _evaluate(
        self, params: FloatArray, X: FloatArray, y: FloatArray, *, score: bool
    ) -> tuple[float, FloatArray, float]:
        grad = np.empty(self.num_params, dtype=np.float64)
        loss, outputs = self._forward_backward(grad, params, X, y)
        return loss, grad, self._score(outputs, y, loss) if score else 0.0

    def _evaluate_into(self, grad: FloatArray, params: FloatArray, X: FloatArray, y: FloatArray) -> tuple[float, float]:
        loss, outputs = self._forward_backward(grad, params, X, y)
        return loss, self._score(outputs, y, loss)

    def _forward_backward(
        self, flat_grad: FloatArray, params: FloatArray, X: FloatArray, y: FloatArray
    ) -> tuple[float, FloatArray]:
        """The summed loss and the outputs $Z$; the gradient written into ``flat_grad`` (every entry)."""
        weights, bias = self._weights(params)
        rows = X.shape[0]
        step = rows_per_block(self.block_bytes, X.itemsize * X.shape[1], rows, self.min_block_rows)
        outputs = np.empty((rows, *weights.shape[1:]), dtype=np.float64)
        if not flat_grad.flags.c_contiguous:  # reshaping it would copy, and the gradient would be lost
            raise ValueError("The gradient buffer must be C-contiguous.")
        grad = flat_grad.reshape(self.num_features + 1, *weights.shape[1:])
        grad[-1] = 0.0
        if rows == 0:
            grad[:-1] = 0.0
        loss = 0.0
        for start in range(0, rows, step):
            block = X[start : start + step]
            z = outputs[start : start + step]
            np.matmul(block, weights, out=z)
            z += bias
            residual, block_loss = self._block_terms(z, y[start : start + step])
            loss += block_loss
            if start == 0 and len(block) == 1:  # X^T R of one row is an outer product: numpy's matmul is slow at it
                np.multiply(block[0].reshape(-1, *[1] * (residual.ndim - 1)), residual[0], out=grad[:-1])
            elif start == 0:  # while the block is still in cache; the first straight into the gradient
                np.matmul(block.T, residual, out=grad[:-1])
            else:
                grad[:-1] += block.T @ residual
            grad[-1] += residual.sum(axis=0)
        return loss, outputs


class LinearRegression(LinearPredictor):
    r"""Least squares $\tfrac12\|Xw + b - y\|^2$ with ``params = [w, b]``.

    :meth:`accuracy` returns the coefficient of determination
    $R^2 = 1 - \sum_i (y_i - \hat y_i)^2 / \sum_i (y_i - \bar y)^2$ (1 is perfect, 0 is as good as
    predicting the mean, negative is worse). For constant targets it returns 1.0 on an exact fit and
    0.0 otherwise.
    """

    kind = "linear"

    def __init__(self, num_features: int) -> None:
        p = check_int("num_features", num_features, 1)
        super().__init__(p, p + 1)

    def _check_labels(self, y: FloatArray) -> FloatArray:
        if not np.all(np.isfinite(y)):
            raise ValueError("y must hold finite values for linear regression.")
        return y

    def _block_terms(self, z: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
        residual = z - y
        return residual, 0.5 * float(residual @ residual)

    def _score(self, z: FloatArray, y: FloatArray, loss: float) -> float:
        return 2.0 * loss  # the residual sum of squares

    def _predict(self, params: FloatArray, X: FloatArray) -> FloatArray:
        return self._outputs(params, X)

    def accuracy(self, params: Any, X: Any, y: Any) -> float:
        """Coefficient of determination $R^2$ of the predictions (see the class docstring)."""
        p = self._check_params(params)
        x, labels = self._check_features_labels(X, y)
        if x.shape[0] == 0:
            raise ValueError("accuracy needs at least one sample; X and y are empty.")
        residual = labels - self._predict(p, x)
        return self.accuracy_from_score(float(residual @ residual), labels)

    def accuracy_from_score(self, score: float, y: Any) -> float:
        """$R^2$ of the samples labelled ``y`` from their residual sum of squares ``score``."""
        labels = _as_float_array("y", y)
        if labels.size == 0:
            raise ValueError("accuracy needs at least one sample; y is empty.")
        centred = labels - labels.mean()
        ss_tot = float(centred @ centred)
        if ss_tot == 0.0:
            return 1.0 if score == 0.0 else 0.0
        return 1.0 - score / ss_tot


def _sigmoid(z: FloatArray) -> FloatArray:
    """Logistic function via tanh: no overflow for any finite ``z``."""
    out: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * z))
    return out


class LogisticRegression(LinearPredictor):
    r"""Binary logistic regression, ``params = [w, b]``, $P(y = 1 \mid x) = \sigma(x^\top w + b)$.

    Labels are 0/1; $-1$ is accepted as a synonym of 0 so that $\pm 1$-labelled data works
    unchanged. The summed loss $\sum_i \log(1 + e^{-t_i z_i})$, $t_i \in \{-1, +1\}$, is evaluated
    with ``logaddexp`` and so never overflows. :meth:`predict` returns 0/1 labels.
    """

    kind = "logistic"

    def __init__(self, num_features: int) -> None:
        p = check_int("num_features", num_features, 1)
        super().__init__(p, p + 1)

    def _check_labels(self, y: FloatArray) -> FloatArray:
        bad = ~((y == 0.0) | (y == 1.0) | (y == -1.0))
        if np.any(bad):
            raise ValueError(
                f"y must hold labels 0 or 1 (or -1 for the negative class) for logistic regression, "
                f"found {y[bad][0]!r}."
            )
        return y

    def _class_targets(self, y: FloatArray) -> FloatArray:
        out: FloatArray = (y > 0).astype(np.float64)
        return out

    def _block_terms(self, z: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
        positive = y > 0
        loss = float(np.logaddexp(0.0, np.where(positive, -z, z)).sum())
        residual = _sigmoid(z)
        residual -= positive
        return residual, loss

    def _score(self, z: FloatArray, y: FloatArray, loss: float) -> float:
        return float(np.count_nonzero((z > 0) == (y > 0)))

    def _predict(self, params: FloatArray, X: FloatArray) -> FloatArray:
        out: FloatArray = (self._outputs(params, X) > 0).astype(np.float64)
        return out


class SoftmaxRegression(LinearPredictor):
    r"""Multinomial logistic (softmax) regression over ``num_classes`` classes.

    ``params`` is the row-major flattening of the $(p + 1) \times C$ matrix $\Theta$ whose first $p$
    rows are the weights and whose last row is the bias; logits are $Z = X W + \mathbf 1 b^\top$.
    The summed cross-entropy $\sum_i (\operatorname{logsumexp}(Z_i) - Z_{i, y_i})$ subtracts each
    row's maximum before exponentiating, so arbitrarily large logits are safe. Labels are floats
    holding integers in $[0, C)$.
    """

    kind = "softmax"

    def __init__(self, num_features: int, num_classes: int) -> None:
        p = check_int("num_features", num_features, 1)
        self.num_classes = check_int("num_classes", num_classes, 2)
        super().__init__(p, (p + 1) * self.num_classes)

    def _check_labels(self, y: FloatArray) -> FloatArray:
        bad = ~((y >= 0) & (y < self.num_classes) & (np.floor(y) == y))
        if np.any(bad):
            raise ValueError(
                f"y must hold integer class labels in [0, {self.num_classes}) for softmax regression, "
                f"found {y[bad][0]!r}."
            )
        return y

    def _weights(self, params: FloatArray) -> tuple[FloatArray, FloatArray]:
        theta = params.reshape(self.num_features + 1, self.num_classes)
        return theta[:-1], theta[-1]

    def _block_terms(self, z: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
        rows, labels = np.arange(z.shape[0]), y.astype(np.intp)
        shifted = z - z.max(axis=1, keepdims=True)
        residual: FloatArray = np.exp(shifted)
        norm = residual.sum(axis=1)
        loss = float((np.log(norm) - shifted[rows, labels]).sum())
        residual /= norm[:, None]  # softmax probabilities, then minus the one-hot targets
        residual[rows, labels] -= 1.0
        return residual, loss

    def _score(self, z: FloatArray, y: FloatArray, loss: float) -> float:
        return float(np.count_nonzero(z.argmax(axis=1) == y.astype(np.intp)))

    def _predict(self, params: FloatArray, X: FloatArray) -> FloatArray:
        out: FloatArray = self._outputs(params, X).argmax(axis=1).astype(np.float64)
        return out

    def __repr__(self) -> str:
        return f"<SoftmaxRegression(num_features={self.num_features}, num_classes={self.num_classes})>"


def save_params(params: FloatArray, path: str | Path) -> list[Path]:
    """Write ``params`` to ``path`` as ``.npy`` (numpy appends the suffix when missing); the file written."""
    target = Path(path)
    np.save(target, params, allow_pickle=False)
    return [target if target.suffix == ".npy" else target.with_name(target.name + ".npy")]


def available_models() -> list[str]:
    """Every model name :func:`make_model` accepts on this machine: the built-ins, then installed plugins."""
    from gradcode.common.training.plugins import model_plugins

    return [*MODEL_KINDS, *model_plugins()]


def make_model(kind: str, *, num_features: int, num_classes: int = 2, dtype: Any = np.float64) -> Model:
    """Build the model named ``kind``: a built-in (:data:`MODEL_KINDS`) or an installed plugin.

    ``num_classes`` is ignored by ``"linear"``, must be 2 for ``"logistic"`` and at least 2 for
    ``"softmax"``; a plugin gets it as given. ``dtype`` (float64 or float32) is the type a plugin
    computes in; the built-in numpy models always compute in float64 (their float32 messages are
    rounded by the worker). An unknown name raises :class:`~gradcode.common.training.plugins.PluginError` (a
    ValueError) listing :func:`available_models`.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in MODEL_DTYPES:
        raise ValueError(f"Argument 'dtype' must be float64 or float32, not {dtype!r}.")
    if kind in MODEL_KINDS:
        return _make_builtin(kind, num_features=num_features, num_classes=num_classes)
    from gradcode.common.training.plugins import PluginError, load_model_factory

    factory = load_model_factory(kind)
    try:
        model = factory(num_features=num_features, num_classes=num_classes, dtype=dt)
    except (ValueError, TypeError) as exc:
        raise PluginError(
            f"Model plugin {kind!r} refused num_features={num_features}, num_classes={num_classes}, "
            f"dtype={dt.name}: {exc}"
        ) from None
    if not isinstance(model, Model):
        raise PluginError(f"Model plugin {kind!r} built {type(model).__name__}, not a gradcode Model.")
    if model.num_features != num_features or model.dtype != dt:
        raise PluginError(
            f"Model plugin {kind!r} built {model!r} with num_features={model.num_features}, dtype={model.dtype}; "
            f"it was asked for num_features={num_features}, dtype={dt.name}."
        )
    return model


def _make_builtin(kind: str, *, num_features: int, num_classes: int) -> Model:
    if kind == "linear":
        return LinearRegression(num_features)
    if kind == "logistic":
        if num_classes != 2:
            raise ValueError(
                f"Argument 'num_classes' must be 2 for a logistic model, not {num_classes!r}; use 'softmax'."
            )
        return LogisticRegression(num_features)
    if kind == "softmax":
        return SoftmaxRegression(num_features, num_classes)
    raise ValueError(f"Unknown model kind {kind!r}; valid kinds are {list(MODEL_KINDS)}.")


def message_length(model: Model, *, statistics: bool) -> int:
    """Elements of a coded message for ``model``: its parameters, plus :data:`NUM_STATISTICS` with statistics."""
    return model.num_params + (NUM_STATISTICS if statistics else 0)


@dataclass(frozen=True)
class TrainingMetrics:
    """What a decoded ``[gradient, loss, score]`` vector says about the training set at the current parameters."""

    gradient: FloatArray
    """The summed, unregularised gradient (a view into the decoded vector)."""
    loss_sum: float
    score_sum: float
    loss: float
    """Mean training loss plus ``l2 / 2 * ||params||^2``: the objective the optimizer minimises."""
    accuracy: float
    """Training accuracy (R^2 for linear regression), as :meth:`Model.accuracy` would compute it."""


def training_metrics(model: Model, decoded: Any, params: Any, y_train: Any, *, l2: float) -> TrainingMetrics:
    """Split a decoded statistics message into gradient, loss and score, and turn them into training metrics.

    ``decoded`` is the decoded sum over all partitions of :meth:`Model.gradient_and_statistics`
    (length ``num_params + NUM_STATISTICS``; a complex decoding contributes its real part);
    ``params`` are the parameters the workers evaluated; ``y_train`` are the training labels (only
    their count, and for linear regression their spread, are used); ``l2`` is the regularisation weight.
    """
    vector = np.asarray(decoded)
    if np.iscomplexobj(vector):
        vector = vector.real
    vector = vector.astype(np.float64, copy=False)
    want = message_length(model, statistics=True)
    if vector.shape != (want,):
        raise ValueError(
            f"A decoded statistics vector for {model!r} has shape ({want},) "
            f"({model.num_params} gradient entries + loss + score), got shape {vector.shape}."
        )
    p = model._check_params(params)
    labels = _as_float_array("y_train", y_train)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"y_train must be a non-empty vector of training labels, got shape {labels.shape}.")
    loss_sum, score_sum = float(vector[-2]), float(vector[-1])
    return TrainingMetrics(
        gradient=vector[: model.num_params],
        loss_sum=loss_sum,
        score_sum=score_sum,
        loss=loss_sum / labels.size + 0.5 * l2 * float(p @ p),
        accuracy=model.accuracy_from_score(score_sum, labels),
    )
