"""Small NumPy statistics shared by the data probes (no SciPy, no scikit-learn, no torch).

Two-sample tests (:func:`ks_columns`, :func:`psi_columns`, :func:`classifier_auc`), a logistic
regression fitted by gradient descent, a rank AUC, a one-feature lookup classifier, and the
helpers every data probe needs (label decoding, feature names, the code line where data meets
the loss).
"""

from __future__ import annotations

import math

import numpy as np

CLASSIFICATION_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy",
                         "binary_cross_entropy_with_logits")
REGRESSION_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


def data_location(ctx) -> dict | None:
    """Where the data enters training.

    Keras ``fit``; under a trainer the line that hands it the data (Lightning's
    ``trainer.fit(model, loader)``, HF's ``Trainer(train_dataset=...)``); else the loss call,
    else ``backward``.
    """
    run = getattr(ctx, "run", None)
    trainer = (run.first("trainer") if run is not None else None) or {}
    if trainer.get("kind") == "lightning" and trainer.get("fit"):
        return {"file": trainer["fit"]["file"], "line": trainer["fit"]["line"]}
    if trainer.get("kind") == "transformers" and ctx.ref("trainer"):
        return ctx.ref("trainer")
    return ctx.ref("fit") or ctx.ref("loss_fn") or ctx.ref("backward")


def loss_name(ctx) -> str | None:
    """The loss function's name when the capture knew it."""
    return (ctx.loss or {}).get("name")


def feature_names(ctx, d: int) -> list[str]:
    """``ctx.feature_names`` when it matches ``d`` columns, else ``x0, x1, ...``."""
    names = ctx.feature_names
    return list(names) if names is not None and len(names) == d else [f"x{i}" for i in range(d)]


def host(value) -> np.ndarray:
    """A torch tensor (on any device) or an array-like as a NumPy array."""
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def as_matrix(x) -> np.ndarray:
    """A float64 (n, features) matrix: 1-D input becomes one column, more dims are flattened."""
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(len(x), -1) if x.ndim != 1 else x[:, None]


def as_labels(y, loss: str | None = None) -> np.ndarray | None:
    """Integer class labels per row, or None when the target looks like a regression target.

    One-hot (or soft) 2-D targets become their argmax; 1-D integer, boolean or integral float
    targets with few distinct values are labels. A known regression loss forces None.
    """
    if y is None or loss in REGRESSION_LOSSES:
        return None
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2 and y.shape[1] > 1:
        if not np.issubdtype(y.dtype, np.number) or not np.isfinite(y).all():
            return None
        rows_sum_one = np.allclose(y.sum(axis=1), 1.0)
        one_hot = np.isin(y, (0, 1)).all()
        if rows_sum_one and (one_hot or loss in CLASSIFICATION_LOSSES):
            return np.argmax(y, axis=1)
        return None
    if y.ndim != 1 or not len(y):
        return None
    if y.dtype == bool or np.issubdtype(y.dtype, np.integer):
        return y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.floating) or not np.isfinite(y).all():
        return None
    if not np.all(y == np.round(y)):
        return None
    if loss in CLASSIFICATION_LOSSES or len(np.unique(y)) <= max(2, min(100, len(y) // 2)):
        return np.round(y).astype(np.int64)
    return None


def subsample(x: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices: all rows, or ``cap`` of them drawn without replacement."""
    n = len(x)
    return np.arange(n) if n <= cap else np.sort(rng.choice(n, cap, replace=False))


def ks_columns(a: np.ndarray, b: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Two-sample Kolmogorov-Smirnov statistic of every column of ``a`` against ``b``.

    The largest gap between the two empirical CDFs: sort the pooled column, walk it adding
    ``1/n`` for a row of ``a`` and ``-1/m`` for a row of ``b`` (in integers, scaled by ``n m``),
    and read the running sum where the value changes (ties are crossed together). Non-finite
    values must be removed beforehand.
    """
    n, m = len(a), len(b)
    out = np.empty(a.shape[1])
    for j in range(0, a.shape[1], chunk):
        z = np.vstack([a[:, j:j + chunk], b[:, j:j + chunk]])
        order = np.argsort(z, axis=0, kind="stable")
        s = np.take_along_axis(z, order, axis=0)
        gap = np.cumsum(np.where(order < n, m, -n), axis=0)    # n*m*(CDF_a - CDF_b), exact
        last = np.ones_like(s, dtype=bool)
        last[:-1] = s[1:] != s[:-1]
        out[j:j + chunk] = np.abs(np.where(last, gap, 0)).max(axis=0) / (n * m)
    return out


def ks_critical(n: int, m: int, alpha: float) -> float:
    """Asymptotic KS critical value ``c(alpha) * sqrt((n + m) / (n m))``."""
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


def psi_columns(expected: np.ndarray, actual: np.ndarray, bins: int = 10, floor: float = 1e-4,
                chunk: int = 256) -> np.ndarray:
    """Population stability index of each column of ``actual`` against ``expected``.

    Bins are the ``bins`` quantile bins of the expected (training) column, right-closed at each
    edge; shares are floored at ``floor``. Repeated edges leave empty bins, which add nothing.
    """
    out = np.empty(expected.shape[1])
    qs = np.linspace(0, 1, bins + 1)[1:-1]
    for j in range(0, expected.shape[1], chunk):
        e_x, a_x = expected[:, j:j + chunk], actual[:, j:j + chunk]
        edges = np.quantile(e_x, qs, axis=0)
        e_bin = (e_x[:, None, :] >= edges[None]).sum(axis=1)
        a_bin = (a_x[:, None, :] >= edges[None]).sum(axis=1)
        e = np.stack([(e_bin == k).mean(axis=0) for k in range(bins)])
        a = np.stack([(a_bin == k).mean(axis=0) for k in range(bins)])
        e, a = np.maximum(e, floor), np.maximum(a, floor)
        out[j:j + chunk] = np.sum((a - e) * np.log(a / e), axis=0)
    return out


def auc(scores, labels) -> float:
    """Area under the ROC curve (Mann-Whitney, ties get average ranks); labels are 0/1."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if not n_pos or not n_neg:
        return math.nan
    _, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inv]
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logistic_fit(x: np.ndarray, y: np.ndarray, steps: int = 300, l2: float = 1e-2) -> np.ndarray:
    """Weights (bias last) of an L2-regularised logistic regression by gradient descent.

    The step is ``1 / L`` with ``L`` the loss's smoothness constant, estimated by power iteration,
    so the descent cannot diverge whatever the feature correlations. With more features than rows
    the same iterates are computed in the row space (``w = X^T a``), which is cheaper.
    """
    xb = np.hstack([x, np.ones((len(x), 1))])
    n, dual = len(xb), len(xb) < xb.shape[1]
    gram = xb @ xb.T / n if dual else xb.T @ xb / n   # same non-zero spectrum either way
    v = np.random.default_rng(0).standard_normal(len(gram))
    for _ in range(30):
        v = gram @ v
        v /= np.linalg.norm(v) or 1.0
    lr = 1.0 / (0.25 * float(v @ gram @ v) + l2)
    coef = np.zeros(len(gram))            # a (rows) in the dual, w (features) in the primal
    for _ in range(steps):
        z = gram @ coef * n if dual else xb @ coef
        r = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30))) - y
        coef -= lr * ((r / n if dual else xb.T @ r / n) + l2 * coef)
    return xb.T @ coef if dual else coef


def classifier_auc(xa: np.ndarray, xb: np.ndarray, seed: int = 0, cap: int | None = None,
                   min_rows: int = 10) -> float | None:
    """Holdout AUC of a logistic regression telling rows of ``xa`` from rows of ``xb``.

    Each sample is split 50/50 (stratified); features are standardised with the fitting half's
    statistics. About 0.5 when both come from one distribution. None when a sample is too small.
    ``cap`` (rows per sample) defaults to ``10^6 / features`` within 200..1000, to bound the time.
    """
    rng = np.random.default_rng(seed)
    if cap is None:
        cap = int(np.clip(1_000_000 // max(xa.shape[1], 1), 200, 1000))
    xa, xb = xa[subsample(xa, cap, rng)], xb[subsample(xb, cap, rng)]
    if min(len(xa), len(xb)) < min_rows:
        return None
    fit, test = [], []
    for label, x in ((0, xa), (1, xb)):
        idx = rng.permutation(len(x))
        half = len(x) // 2
        fit.append((x[idx[:half]], np.full(half, label)))
        test.append((x[idx[half:]], np.full(len(x) - half, label)))
    x_fit, y_fit = (np.concatenate(p) for p in zip(*fit))
    x_test, y_test = (np.concatenate(p) for p in zip(*test))
    x_fit, x_test = np.nan_to_num(x_fit), np.nan_to_num(x_test)
    mu, sd = x_fit.mean(axis=0), x_fit.std(axis=0)
    sd[sd == 0] = 1.0
    w = logistic_fit((x_fit - mu) / sd, y_fit.astype(float))
    return auc(((x_test - mu) / sd) @ w[:-1] + w[-1], y_test)


def lookup_accuracy(x: np.ndarray, labels: np.ndarray,
                    folds: tuple[np.ndarray, np.ndarray]) -> float:
    """Two-fold accuracy of a one-feature classifier: the majority label of the nearest value.

    On a discrete feature this is a lookup table; on a continuous one, 1-nearest-neighbour in one
    dimension. Scored on the fold it was not fitted on, so it cannot memorise. ``labels`` are
    ``0 .. k-1``; ``folds`` are two disjoint index arrays.
    """
    correct = 0
    for fit, test in (folds, folds[::-1]):
        vals, inv = np.unique(x[fit], return_inverse=True)
        k = int(labels.max()) + 1
        codes, counts = np.unique(inv * k + labels[fit], return_counts=True)
        v, lab = codes // k, codes % k
        order = np.lexsort((-counts, v))
        first = order[np.r_[True, v[order][1:] != v[order][:-1]]]
        majority = lab[first]
        xt = x[test]
        pos = np.searchsorted(vals, xt)
        left, right = np.clip(pos - 1, 0, len(vals) - 1), np.clip(pos, 0, len(vals) - 1)
        near = np.where(np.abs(xt - vals[left]) <= np.abs(vals[right] - xt), left, right)
        correct += int((majority[near] == labels[test]).sum())
    return correct / (len(folds[0]) + len(folds[1]))


def knn_score(x: np.ndarray, y: np.ndarray, classes: bool, k: int = 5, seed: int = 0,
              cap: int = 1536) -> float:
    """Two-fold score of a k-nearest-neighbour predictor on standardised features.

    An independent learner: it needs no training, so it shows whether the targets can be
    told from the inputs at all, whatever a particular model can learn. Accuracy of the
    neighbours' majority label (``classes``) or R^2 of their mean target, on the fold it was
    not fitted on.
    """
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))[:cap]
    x, y = as_matrix(x)[idx][:, :4096], np.asarray(y)[idx]
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd[sd == 0] = 1.0
    x = (x - mu) / sd
    half = len(y) // 2
    folds = (np.arange(half), np.arange(half, len(y)))
    hits, sq, tot = 0.0, 0.0, 0.0
    for fit, test in (folds, folds[::-1]):
        d = (x[test] ** 2).sum(1)[:, None] - 2 * x[test] @ x[fit].T + (x[fit] ** 2).sum(1)[None]
        near = np.argsort(d, axis=1)[:, :k]
        if classes:
            votes = y[fit][near].astype(np.int64)
            pred = np.array([np.bincount(v).argmax() for v in votes])
            hits += float((pred == y[test]).sum())
        else:
            pred = y[fit][near].astype(np.float64).mean(axis=1)
            sq += float(((pred - y[test]) ** 2).sum())
            tot += float(((y[test] - y[fit].mean()) ** 2).sum())
    if classes:
        return hits / len(y)
    return 1.0 - sq / tot if tot > 0 else 0.0
