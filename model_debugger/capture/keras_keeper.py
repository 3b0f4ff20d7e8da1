"""What Isolate needs from a captured Keras run, and the label statistics of what ``fit`` received.

The Keras instrument feeds a :class:`KerasKeeper` (the model, a copy of its weights from before the
first step, the optimizer class and config, the compiled loss, sample batches as NumPy arrays) and
a :class:`LabelStats` (class counts or target moments, written as a ``targets`` event under the
PyTorch loss names, so signals and baselines work unchanged). Importing this module imports
neither tensorflow nor keras.
"""

from __future__ import annotations

import re

import numpy as np

from ._util import PRESSED
from .spill import Spill, SpilledState, open_spill, threshold_bytes

MAX_BATCHES = 32
MAX_SAMPLES = 4096
_MAX_CLASSES = 1000

# Keras loss identifiers -> the PyTorch functional names the record speaks
_LOSS_NAMES = {
    "sparse_categorical_crossentropy": "cross_entropy",
    "categorical_crossentropy": "cross_entropy",
    "binary_crossentropy": "binary_cross_entropy",
    "mean_squared_error": "mse_loss", "mse": "mse_loss",
    "mean_absolute_error": "l1_loss", "mae": "l1_loss",
    "huber": "huber_loss", "huber_loss": "huber_loss",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def describe_loss(loss) -> dict | None:
    """``{"name", "keras", "from_logits", "sparse"}`` for a compiled Keras loss, or None.

    ``name`` is the PyTorch-style name used across records (``cross_entropy``, ``mse_loss``, ...);
    ``keras`` is the Keras identifier (``sparse_categorical_crossentropy``).
    """
    if isinstance(loss, (list, tuple, dict)):
        items = list(loss.values()) if isinstance(loss, dict) else list(loss)
        loss = items[0] if len(items) == 1 else None
    if loss is None:
        return None
    from_logits = False
    if isinstance(loss, str):
        ident = loss
    elif hasattr(loss, "get_config"):  # a keras.losses.Loss instance
        try:
            from_logits = bool(loss.get_config().get("from_logits", False))
        except Exception:  # noqa: BLE001 - a custom loss without a usable config
            pass
        ident = getattr(loss, "name", None) or _snake(type(loss).__name__)
    else:  # a loss function
        ident = getattr(loss, "__name__", None) or _snake(type(loss).__name__)
    ident = str(ident).lower()
    name = _LOSS_NAMES.get(ident)
    if name == "binary_cross_entropy" and from_logits:
        name = "binary_cross_entropy_with_logits"
    return {"name": name, "keras": ident, "from_logits": from_logits,
            "sparse": ident.startswith("sparse"), "object": loss}


VALUES_KEPT = 8192  # targets kept when the loss is not known (their constant predictor)


class LabelStats:
    """Class counts (classification) or sum / sum of squares (regression) of the training targets."""

    def __init__(self) -> None:
        self.loss: str | None = None
        self.keras: str | None = None
        self.n = 0
        self.counts: np.ndarray | None = None
        # sum, sum of squares, and the counts below 0, above 1 and below -1 (the ranges a
        # bounded output has: [0, inf), [0, 1], [-1, 1])
        self.moments = np.zeros(5)
        self.outputs: dict | None = None  # the trained model's outputs on kept rows
        self.weighted = False  # fit weighted the loss (class_weight, sample_weight)
        self.class_weight: list[float] | None = None  # fit's class_weight, by class id
        self.values: list[np.ndarray] = []  # targets under a loss the capture does not know
        self.kept = 0
        self.values_epoch: int | None = None

    def observe_values(self, y, epoch: int = 0) -> None:
        """Keep up to :data:`VALUES_KEPT` numeric targets when the loss is not known.

        A ``train_step`` that computes its own loss (``model.compile()`` without one): the
        record cannot give that loss a constant-predictor baseline, but the metrics the run
        reports (``mae``, ``mse``) are known functions, and the targets give theirs.
        """
        if self.loss is not None or y is None or self.kept >= VALUES_KEPT or \
                self.values_epoch not in (None, epoch):
            return  # (the first epoch only: the next ones hold the same rows again)
        self.values_epoch = epoch
        y = np.asarray(y)
        if y.dtype.kind not in "fiu" or y.ndim > 2 or (y.ndim == 2 and y.shape[1] != 1):
            return
        f = y.astype(np.float64).reshape(-1)[:VALUES_KEPT - self.kept]
        f = f[np.isfinite(f)]
        self.values.append(f)
        self.kept += int(f.size)

    def values_event(self) -> dict | None:
        """The ``target_values`` event: what a constant prediction scores on the targets kept.

        With the shares of targets below 0, above 1 and below -1, and the model's output range
        when it was read (:meth:`observe_outputs`): a ``train_step`` with its own loss over a
        sigmoid output still shows the targets it cannot reach.
        """
        if self.loss is not None or self.kept < 2:
            return None
        f = np.concatenate(self.values)
        median = float(np.median(f))
        data = {"n": int(f.size), "mean": float(f.mean()), "var": float(f.var()),
                "median": median, "mad": float(np.abs(f - median).mean()),
                "negative": float((f < 0).mean()), "above_one": float((f > 1).mean()),
                "below_minus_one": float((f < -1).mean())}
        if self.outputs is not None:  # the trained model's range, as the targets event has it
            data.update(self.outputs)
            # the least error any output in that range leaves: the targets clipped into it
            gap = f - np.clip(f, self.outputs["input_min"], self.outputs["input_max"])
            data["clip_mse"], data["clip_mae"] = float((gap ** 2).mean()), \
                float(np.abs(gap).mean())
        return data

    def observe(self, y) -> None:
        """Add one batch of targets ``y``: class counts (cross-entropy) or sum and sum of squares.

        Class targets with more than the class limit, or labels outside it, are skipped.
        """
        if self.loss is None or y is None:
            return
        y = np.asarray(y)
        if self.loss == "cross_entropy":
            if self.keras == "categorical_crossentropy" and y.ndim >= 2 and y.shape[-1] > 1:
                if y.shape[-1] > _MAX_CLASSES:
                    return
                labels = y.reshape(-1, y.shape[-1]).argmax(-1)
                width = y.shape[-1]
            else:
                labels = y.reshape(-1)
                if not len(labels) or labels.min() < 0 or labels.max() >= _MAX_CLASSES:
                    return
                labels = labels.astype(np.int64)
                width = int(labels.max()) + 1
            counts = np.bincount(labels, minlength=width)
            if self.counts is None:
                self.counts = counts
            else:
                size = max(len(counts), len(self.counts))
                self.counts = np.pad(self.counts, (0, size - len(self.counts))) + \
                    np.pad(counts, (0, size - len(counts)))
            self.n += int(len(labels))
        else:
            f = y.astype(np.float64).reshape(-1)
            self.moments += (f.sum(), float(f @ f), (f < 0).sum(), (f > 1).sum(),
                             (f < -1).sum())
            self.n += int(f.size)

    def observe_outputs(self, out) -> None:
        """Keep the range of the model's outputs ``out`` (what the loss reads).

        The minimum, maximum, share of exact zeros and the shares pressed against a sigmoid's
        or tanh's bounds: the same statistics the PyTorch capture keeps of the loss inputs, so
        an output confined to a range the targets leave (a sigmoid on a regression) is read
        the same way in both frameworks.
        """
        x = np.asarray(out, dtype=np.float64).reshape(-1)
        x = x[np.isfinite(x)]
        if not x.size:
            return
        self.outputs = {"input_min": float(x.min()), "input_max": float(x.max()),
                        "input_zero_share": float((x == 0).mean()),
                        "input_pressed": {"1": float((x >= 1 - PRESSED).mean()),
                                          "-1": float((x <= -1 + PRESSED).mean()),
                                          "0": float(((x >= 0) & (x <= PRESSED)).mean())}}

    def event(self) -> dict | None:
        """The ``targets`` event payload, or None when nothing was seen."""
        if self.loss is None or not self.n:
            return None
        data = {"loss": self.loss, "n": self.n}
        if self.weighted:
            data["weighted"] = True
            data["weights"] = "element"  # sample_weight: per sample, no known scale
            if self.class_weight is not None:
                data["weights"], data["class_weight"] = "class_weight", list(self.class_weight)
        if self.counts is not None:
            data["counts"] = [int(c) for c in self.counts]
        elif self.loss != "cross_entropy":
            mean = self.moments[0] / self.n
            data["mean"], data["var"] = float(mean), max(float(self.moments[1] / self.n
                                                               - mean ** 2), 0.0)
            data["negative"], data["above_one"], data["below_minus_one"] = \
                (float(v / self.n) for v in self.moments[2:])
        else:
            return None
        if self.outputs is not None:
            data.update(self.outputs)
        return data


def describe_heads(loss, names) -> dict | None:
    """``{output name: describe_loss(...)}`` for a model with several outputs, or None.

    ``loss`` is what ``compile`` got: a dict keyed by output name, a list in the order of
    ``names`` (the model's ``output_names``), or one loss that Keras applies to every output.
    Heads whose loss is not one the record knows are left out; None for one output.
    """
    names = [str(n) for n in names or ()]
    if isinstance(loss, dict):
        items = {str(k): v for k, v in loss.items()}
    elif isinstance(loss, (list, tuple)) and len(loss) == len(names) > 1:
        items = dict(zip(names, loss))
    elif len(names) > 1 and loss is not None and not isinstance(loss, (list, tuple)):
        items = dict.fromkeys(names, loss)
    else:
        return None
    if len(items) < 2:
        return None
    heads = {k: describe_loss(v) for k, v in items.items() if v is not None}
    return {k: d for k, d in heads.items() if d and d["name"]} or None


class HeadStats:
    """:class:`LabelStats` for each output of a multi-output model (targets as a dict or list).

    Each head's targets and outputs are read exactly as one output's are, so a head whose
    activation cannot reach its targets (a ReLU on a standardised regression head beside a
    classification head) is measured like a single-output model's.
    """

    def __init__(self, heads: dict, names) -> None:
        self.names = [str(n) for n in names or ()]
        self.stats: dict[str, LabelStats] = {}
        for name, desc in heads.items():
            stats = LabelStats()
            stats.loss, stats.keras = desc["name"], desc["keras"]
            self.stats[name] = stats

    def parts(self, value) -> dict:
        """A dict or list of per-output values keyed by output name ({} when neither)."""
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        if isinstance(value, (list, tuple)) and len(value) == len(self.names):
            return dict(zip(self.names, value))
        return {}

    def observe(self, y) -> None:
        """Add one batch of targets (a dict or list, one entry per output)."""
        for name, part in self.parts(y).items():
            if name in self.stats and part is not None:
                self.stats[name].observe(to_numpy(part))

    def observe_outputs(self, out) -> None:
        """Keep the range of each output the loss reads."""
        for name, part in self.parts(out).items():
            if name in self.stats and part is not None:
                self.stats[name].observe_outputs(to_numpy(part))

    def events(self) -> list[dict]:
        """One ``head_targets`` payload per head that saw targets."""
        out = []
        for name, stats in self.stats.items():
            data = stats.event()
            if data is not None:
                index = self.names.index(name) if name in self.names else None
                out.append({"head": name, "index": index, **data})
        return out


def to_numpy(value):
    """A tensor / array / nested tuple as NumPy (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    if hasattr(value, "numpy"):
        return value.numpy()
    return np.asarray(value)


def split_batch(data) -> tuple:
    """``(x, y)`` of one batch the way Keras unpacks it (``x``, ``(x,)``, ``(x, y[, w])``)."""
    if isinstance(data, (tuple, list)):
        if len(data) == 1:
            return data[0], None
        return data[0], data[1]
    return data, None


class KerasKeeper(SpilledState):
    """Live objects of a captured Keras run, for Isolate.

    Attributes mirror :class:`~model_debugger.capture.keeper.Keeper`: ``model``,
    ``initial_state`` (a list of weight arrays; above ``MODEL_DEBUGGER_SPILL_MB`` read back from
    a temporary file on each access, see :mod:`.spill`), ``optimizer`` (``{"cls", "name", "hyper",
    "config"}``), ``loss`` (:func:`describe_loss`), ``train_batches`` / ``val_batches`` as
    ``((x,), y)`` NumPy pairs, ``train_loader`` (what ``fit`` iterated, for the throughput probe).
    """

    framework = "keras"

    def __init__(self) -> None:
        self.model = None
        self._initial_state: list | None = None
        self._spill = None
        self._spilled: list | None = None  # (index, dtype, shape) per weight in the spill file
        self.namespace: dict | None = None
        self.optimizer: dict | None = None
        self.loss: dict | None = None
        self.train_batches: list = []
        self.val_batches: list = []
        self.init_args: tuple | None = None  # (args, kwargs) a subclassed model was built with
        self.train_loader = None
        self.heads_x: tuple | None = None  # a multi-output model's first training inputs
        self.validation = None  # what fit received as validation data (materialised lazily)
        self.zero_grad_calls = 0
        self.loss_input: dict | None = None
        self.class_weight: list[float] | None = None  # fit's class_weight, by class id
        self._samples = 0
        self._epoch: int | None = None
        self._rows: set[int] = set()  # hashes of the kept (x, y) rows
        self._wrapped = False  # a batch of rows all kept already: the data came round again
        self.came_round: int | None = None  # rows kept when it did (None: not seen)
        # a custom loop leaves each pass over its dataset early: a pass is not the data, so
        # batches are kept past the first epoch
        self.cut_passes = False

    def on_model(self, model, namespace: dict | None) -> None:
        """Keep the first model seen, its namespace and a host copy of its initial weights.

        Weights above the spill threshold go to a temporary file (:mod:`.spill`); an unbuilt model's
        weights are taken later.
        """
        if self.model is not None:
            return
        self.model = model
        self.namespace = namespace
        self.keep_initial_weights()

    def keep_initial_weights(self) -> None:
        """Take the host copy of the model's weights, unless taken already or still unbuilt.

        A subclassed model has no weights until its first call (or only some: a Normalization
        adapted before ``fit``): the capture calls this again just before the first optimizer
        step (its weights then are still the initial ones), and a copy that holds fewer weights
        than the model now has is taken again.
        """
        model = self.model
        if model is None:
            return
        try:
            weights = list(model.weights)  # get_weights() order; one host copy at a time
            if not weights:  # not built yet
                return
            taken = len(self._initial_state) if self._initial_state is not None else \
                len(self._spilled) if self._spill is not None else None
            if taken is not None and taken >= len(weights):
                return
            if taken is not None:  # built in part before (an adapted Normalization): its
                self._drop_spill()  # first call built the rest, no update yet: take them all
                self._initial_state = None
            size = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in weights)
            spill = open_spill() if size > threshold_bytes() else None  # None: in RAM
            if spill is not None:
                self._spill_weights(weights, spill)
            else:
                self._initial_state = [np.array(w.numpy(), copy=True) for w in weights]
        except Exception:  # noqa: BLE001 - an unbuilt model: weights are taken later
            self._initial_state = None

    def _spill_weights(self, weights, spill: Spill) -> None:
        spilled = []
        try:
            for w in weights:
                arr = np.asarray(w.numpy())
                spilled.append((spill.add(arr), arr.dtype, arr.shape))
                del arr
            spill.close()
        except BaseException:
            spill.remove()
            raise
        self._spill, self._spilled = spill, spilled

    def _read_spill(self) -> list:
        """The weights from before the first step, read back from the spill file."""
        return [self._spill.get(i).view(dtype).reshape(shape) if int(np.prod(shape)) else
                np.empty(shape, dtype=dtype) for i, dtype, shape in self._spilled]

    def release(self) -> None:
        """Let go of the model, the batches, the data and the initial weights (file too)."""
        self._drop_spill()
        self._initial_state = None
        self.model = self.namespace = self.train_loader = self.validation = None
        self.train_batches, self.val_batches, self.heads_x = [], [], None

    def on_optimizer(self, opt, hyper: dict, config: dict) -> None:
        """Keep the first optimizer's class, name, hyperparameters and config (read eagerly).

        A ``LossScaleOptimizer`` (what ``compile`` makes of the optimizer under a float16
        policy) is kept as the optimizer it wraps: the copies are built from that class and
        config (the wrapper's own config names no rate, and its class needs the inner one).
        """
        inner = getattr(opt, "inner_optimizer", None)
        if inner is not None:
            try:
                opt, config = inner, inner.get_config()
            except Exception:  # noqa: BLE001 - keep the wrapper as it is
                pass
        if self.optimizer is None:
            self.optimizer = {"cls": type(opt), "name": type(opt).__name__, "hyper": dict(hyper),
                              "config": config}

    def on_batch(self, x, y, epoch: int) -> None:
        """Keep a sample of the first epoch's training batches (bounded)."""
        if self._epoch is None:
            self._epoch = epoch
        if self.full(self._epoch) or y is None or \
                epoch > self._epoch + 1 and self.full(epoch):  # (repeats: one epoch on)
            return
        if self.heads_x is not None and isinstance(y, (dict, list, tuple)):
            return  # a multi-output model's inputs are kept once
        xs = self.positional(to_numpy(x))
        y = to_numpy(y)
        if xs is None:
            return
        if isinstance(y, (dict, list, tuple)):  # one target per output: no copy trains on
            if self.heads_x is None:          # these (no trainer takes them); each output's
                self.heads_x = xs             # range is read on these inputs
            return
        if not all(hasattr(a, "shape") and a.shape[:1] == y.shape[:1] for a in xs):
            return
        if not _adds_rows(self._rows, (*xs, y)):  # every row kept already: the data came
            self._wrapped = True                    # round (the same batch every step, or a
            self.came_round = self._samples         # custom loop's next epoch)
            return
        if self.full(epoch):  # a later epoch's new rows: not kept (checked for repeats only)
            return
        self.train_batches.append((xs, y))
        self._samples += int(y.shape[0])

    def positional(self, x) -> tuple | None:
        """A batch's inputs as a tuple in the model's input order; None when it cannot say.

        A dict (``fit({"numeric": ..., "store": ...}, y)``) is ordered as ``model.inputs``:
        by the keys of the dict the model was built on (flattened as Keras does), else by the
        names of the model's inputs (``keras.Input(name=...)``); copies of the model are given
        them back in that structure.
        """
        if not isinstance(x, dict):
            return tuple(x) if isinstance(x, (tuple, list)) else (x,)
        struct = getattr(self.model, "_inputs_struct", None)
        if isinstance(struct, dict) and set(map(str, struct)) == set(map(str, x)):
            import keras  # (a dict keyed as the model was built: its flattened order)

            return tuple(keras.tree.flatten({k: x[k] for k in struct}))
        names = [getattr(t, "name", None) for t in getattr(self.model, "inputs", None) or []]
        if not names or set(names) != set(x):
            return None
        return tuple(x[name] for name in names)

    def full(self, epoch: int) -> bool:
        """Whether :meth:`on_batch` keeps no more batches.

        True when the bound is reached, ``epoch`` is past the first one seen, or a batch held
        only rows kept already (the data came round again).
        """
        return self._wrapped or len(self.train_batches) >= MAX_BATCHES or \
            self._samples >= MAX_SAMPLES or \
            (self._epoch is not None and epoch != self._epoch and not self.cut_passes)

    def materialise_validation(self) -> None:
        """Turn what ``fit`` got as validation data into ``val_batches`` (arrays or a dataset)."""
        val, self.validation = self.validation, None
        if val is None or self.val_batches:
            return
        try:
            if isinstance(val, (tuple, list)):
                x, y = split_batch(val)
                xs, y = self.positional(to_numpy(x)), to_numpy(y)
                if xs is None or y is None:
                    return
                self.val_batches.append((tuple(a[:MAX_SAMPLES] for a in xs), y[:MAX_SAMPLES]))
                return
            seen = 0
            for batch in val:  # a tf.data.Dataset or a PyDataset: the first batches
                x, y = split_batch(to_numpy(batch))
                xs = self.positional(x)
                if y is None or xs is None:
                    return
                self.val_batches.append((xs, y))
                seen += len(y)
                if seen >= MAX_SAMPLES or len(self.val_batches) >= MAX_BATCHES:
                    break
        except Exception:  # noqa: BLE001 - validation data that cannot be re-read
            return

    def arrays(self) -> tuple:
        """``(train_xy, val_xy)``: flattened NumPy samples for the data probes (rows deduplicated)."""
        self.materialise_validation()
        return _arrays(self.train_batches), _arrays(self.val_batches)


def _adds_rows(seen: set, arrays: tuple) -> bool:
    """Whether a batch holds a row not in ``seen`` (adding its rows to ``seen``).

    A row is its inputs and target together (row-aligned arrays).
    """
    flat = [np.ascontiguousarray(a).reshape(len(a), -1) for a in arrays]
    before = len(seen)
    seen.update(hash(b"".join(f[i].tobytes() for f in flat)) for i in range(len(flat[0])))
    return len(seen) > before


def _arrays(batches) -> tuple | None:
    if not batches:
        return None
    try:
        xs = np.concatenate([np.asarray(b[0][0], dtype=np.float64).reshape(len(b[1]), -1)
                             for b in batches])
        ys = np.concatenate([np.asarray(b[1]) for b in batches])
    except (ValueError, TypeError):
        return None
    if ys.ndim == 2 and ys.shape[1] == 1:
        ys = ys[:, 0]
    _, first = np.unique(xs, axis=0, return_index=True)
    first.sort()
    return xs[first], ys[first]
