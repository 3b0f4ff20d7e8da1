"""Live objects kept for Isolate: the model, its initial weights, sample batches, the loader.

Only references and one copy of the initial weights are kept; sample batches are bounded.
The copy of a large model's weights (above ``MODEL_DEBUGGER_SPILL_MB``, see :mod:`.spill`) is
written to a temporary file, one tensor at a time, and read back when a probe asks for
``initial_state``. The TorchInstrument feeds the keeper; probes read it after the captured code
has finished; :meth:`Keeper.release` lets everything go (the Recorder keeps its keeper until
then, or until it is dropped itself).
"""

from __future__ import annotations

import weakref

import numpy as np

from .spill import Spill, SpilledState, open_spill, threshold_bytes

MAX_BATCHES = 32
MAX_SAMPLES = 4096
HEAD = 8     # the first batches are always kept; past them, one in ``stride`` ...
SPREAD = 16  # ... thinned (every other one dropped, the stride doubled) whenever the sample is
             # full, over at most MAX_BATCHES * SPREAD batches of the first epoch: a sample of
             # the whole epoch in its order, not its first rows (a training set sorted by class
             # would give the first class alone)


WRAPPERS = ("DistributedDataParallel", "DataParallel")  # kept unwrapped (their .module)


class Keeper(SpilledState):
    """What Isolate needs from a captured PyTorch run.

    Attributes
    ----------
    model : torch.nn.Module or None
    initial_state : dict or None
        Parameter and buffer copies taken when the model was first seen (before any step):
        in RAM, or read back from the spill file on each access (fresh tensors each time).
    namespace : dict or None
        The globals of the user code that holds the model (for retained-tensor checks).
    optimizer : dict or None
        ``{"cls", "name", "hyper"}``.
    loss : dict or None
        ``{"name", "kwargs", "input_shape"}`` of the training loss.
    train_batches, val_batches : list of (inputs, target)
        ``inputs`` is a tuple of tensors: the positional ones, then those passed by keyword.
    input_names : tuple of str or None
        The keywords of the trailing ``inputs`` (empty for a model called positionally).
    train_loader : DataLoader or None
    train_dataset : object or None
        The training loader's dataset, kept also when the loader was made inline and is gone
        (``for xb, yb in DataLoader(ds, ...)``).
    zero_grad_calls : int
    """

    def __init__(self) -> None:
        self.model = None
        self._initial_state = None
        self._spill = None
        self._spilled: dict | None = None  # name -> (index, dtype, shape) in the spill file
        self._order: list = []  # state_dict order of the spilled state
        self.namespace = None
        self.optimizer = None
        self.loss = None
        self.train_batches: list = []
        self.val_batches: list = []
        # keywords of the batch inputs after the positional ones (``input_ids``, ...), see
        # ``_batch_tensors``: the same for every kept batch
        self.input_names: tuple | None = None
        self._samples = {"train": 0, "val": 0}
        self._epoch: dict[str, int] = {}
        self._offered = {"train": 0, "val": 0}  # batches of the sampling epoch seen so far
        self._stride = {"train": 1, "val": 1}
        self._kept_at: dict[str, list[int]] = {"train": [], "val": []}  # their positions
        self.train_loader = None
        self.train_dataset = None
        # the training loop leaves each pass over its loader early: a pass is not the data, so
        # training batches are kept past the first one
        self.cut_passes = False
        self.zero_grad_calls = 0
        self.loss_input: dict | None = None
        # what named the kept validation targets: a loss call ("loss"), or a hand-written
        # score comparing predictions with them ("compare", :meth:`on_eval_labels`)
        self.val_source: str | None = None
        self._val_sources: list = []  # weak references to the validation inputs kept

    def on_model(self, model, namespace: dict | None) -> None:
        """Keep the first model seen, its namespace and a CPU copy of its initial state.

        A state above the spill threshold is written to a temporary file instead (:mod:`.spill`).
        """
        import torch

        if self.model is not None:
            return
        if type(model).__name__ in WRAPPERS and isinstance(getattr(model, "module", None),
                                                           torch.nn.Module):
            model = model.module  # probes train copies of the model itself, on one process
        self.model = model
        self.namespace = namespace
        state = model.state_dict()
        size = sum(v.numel() * v.element_size() for v in state.values()
                   if isinstance(v, torch.Tensor))
        with torch.no_grad():  # on the CPU: a copy on the GPU would change what is measured
            spill = open_spill() if size > threshold_bytes() else None  # None: in RAM
            if spill is not None:
                self._spill_state(state, spill)
            else:
                self._initial_state = {k: v.detach().to("cpu", copy=True)
                                       for k, v in state.items()}

    def _spill_state(self, state: dict, spill: Spill) -> None:
        """Write each tensor's bytes to the spill file (one host copy at a time at most)."""
        import torch

        spilled, kept = {}, {}
        try:
            for k, v in state.items():
                t = v.detach()
                if not isinstance(t, torch.Tensor) or t.layout != torch.strided or \
                        t.is_quantized or t.dtype.is_complex:
                    kept[k] = t.to("cpu", copy=True) if isinstance(t, torch.Tensor) else t
                    continue
                host = t.to("cpu").contiguous()  # no copy for a contiguous CPU tensor
                index = spill.add(host.reshape(-1).view(torch.uint8).numpy())
                spilled[k] = (index, t.dtype, tuple(t.shape))
            spill.close()
        except BaseException:
            spill.remove()
            raise
        self._spill, self._spilled, self._order = spill, spilled, list(state)
        self._initial_state = kept  # the few tensors a file cannot hold

    def _read_spill(self) -> dict:
        """The initial parameters and buffers, the spilled ones read back from the file."""
        import torch

        kept = self._initial_state or {}
        out = {}
        for k in self._order:
            if k in kept:
                out[k] = kept[k]
                continue
            index, dtype, shape = self._spilled[k]
            raw = torch.from_numpy(self._spill.get(index))
            out[k] = raw.view(dtype).reshape(shape) if raw.numel() else \
                torch.empty(shape, dtype=dtype)
        return out

    def release(self) -> None:
        """Let go of the model, the batches, the loader and the initial weights (file too)."""
        self._drop_spill()
        self._initial_state = None
        self.model = self.namespace = self.train_loader = self.train_dataset = None
        self.train_batches, self.val_batches, self._val_sources = [], [], []
        self.input_names = None

    def arrays(self) -> tuple:
        """``(train_xy, val_xy)``: flattened NumPy samples for the data probes.

        Rows are deduplicated; each is None when its batches do not flatten to one matrix.
        Validation is :meth:`validation_batches`.
        """
        return _arrays(self.train_batches), _arrays(self.validation_batches())

    def validation_batches(self) -> list:
        """The kept evaluation batches that are validation data.

        An evaluation pass over the training rows (a training accuracy computed under
        ``no_grad``: a batch holding >= ``TRAIN_PASS`` of the distinct kept training rows) is
        no validation and is left out, unless every kept evaluation batch is one (a validation
        set that is the training set: a leak to report). Only when the kept training rows are
        mostly distinct: inputs of a few possible values (binary features) appear in any large
        batch.
        """
        train = _row_keys(self.train_batches)
        head, rows = [], 0  # the first kept training rows: mostly distinct?
        for b in self.train_batches:
            head.append(b)
            rows += len(b[1])
            if rows >= 256:
                break
        if not train or len(self.val_batches) < 2 or len(_row_keys(head)) < TRAIN_PASS * rows:
            return self.val_batches
        passes = [len(train & _row_keys([b])) >= TRAIN_PASS * len(train)
                  for b in self.val_batches]
        if all(passes) or not any(passes):
            return self.val_batches
        return [b for b, over_train in zip(self.val_batches, passes) if not over_train]

    def on_optimizer(self, opt) -> None:
        """Keep the first optimizer's class, name and hyperparameters; every one's parameters.

        ``param_ids`` (which parameters the optimizers update, all of them together): copies
        train the same ones.
        """
        ids = frozenset(id(p) for g in opt.param_groups for p in g["params"])
        if self.optimizer is None:
            self.optimizer = {"cls": type(opt), "name": type(opt).__name__,
                              "hyper": dict(opt.defaults), "param_ids": ids}
        else:
            self.optimizer["param_ids"] = self.optimizer.get("param_ids", frozenset()) | ids

    def sampling(self, training: bool, epoch: int) -> bool:
        """Whether :meth:`on_loss` may still keep something for this split and epoch."""
        split = "train" if training else "val"
        if training and self.loss is None:
            return True
        first = self._epoch.get(split)
        batches = self.train_batches if training else self.val_batches
        full = self._samples[split] >= MAX_SAMPLES or len(batches) >= MAX_BATCHES
        return (first is None or epoch == first or training and self.cut_passes) \
            and (not full or self._offered[split] < MAX_BATCHES * SPREAD)

    def on_loss(self, name, input, target, extra_args, kwargs, model_input, training,
                epoch: int = 0) -> dict | None:
        """Keep a sample (model input, target); on the first training call describe the input.

        Samples come from the first epoch (or eval pass) only, so repeated epochs over a small
        dataset do not fill the sample with copies; training samples come from later epochs
        too when a loop leaves its passes early (:attr:`cut_passes`). Past :data:`HEAD`
        batches, a full sample is thinned so that it spreads over the epoch (:meth:`_admits`).
        """
        split = "train" if training else "val"
        out = None
        if training and self.loss is None:
            self.loss = {"name": name, "kwargs": dict(kwargs),
                         "input_shape": tuple(input.shape[1:]) if input.dim() >= 1 else None}
            if extra_args:
                self.loss["kwargs"].update(_positional(name, extra_args))
            out = self.loss_input = describe_loss_input(name, input)
        if not training and self.val_source != "loss":
            if self.val_source == "compare":  # a validation loss names its targets surely
                self._reset("val")
            self.val_source = "loss"
        self._keep(split, model_input, target, epoch)
        return out

    def wants_eval_labels(self, epoch: int) -> bool:
        """Whether :meth:`on_eval_labels` may keep something now (no validation loss did)."""
        return self.val_source != "loss" and self.model is not None and \
            self.sampling(False, epoch)

    def on_eval_labels(self, model_input, target, epoch: int = 0) -> None:
        """Keep a validation batch whose labels a hand-written score compared predictions with.

        ``(model(xv).argmax(1) == yv).float().mean()`` computes no loss, so :meth:`on_loss`
        never sees ``yv``; the capture found it in the comparison. A validation loss, when the
        loop also computes one, replaces these batches (it names its targets surely). A batch
        whose rows are mostly kept training rows is a score of the training set, not
        validation: not kept.
        """
        if self.val_source == "loss":
            return
        kept = _batch_tensors(model_input, target)
        if kept is None or self._over_training_rows(kept[0]):
            return  # a score of the training rows (a training F1 computed under no_grad)
        self.val_source = "compare"
        self._keep("val", model_input, target, epoch)

    def _over_training_rows(self, tensors) -> bool:
        """Whether most rows of a batch's first input are among the kept training rows."""
        train = _row_keys(self.train_batches)
        rows = _row_keys([(tensors, np.zeros(len(tensors[0])))])
        return bool(train) and bool(rows) and len(rows & train) >= TRAIN_PASS * len(rows)

    def _reset(self, split: str) -> None:
        (self.train_batches if split == "train" else self.val_batches).clear()
        if split == "val":
            self._val_sources = []
        self._samples[split] = self._offered[split] = 0
        self._stride[split] = 1
        self._kept_at[split] = []
        self._epoch.pop(split, None)

    def _keep(self, split: str, model_input, target, epoch: int) -> None:
        """Keep ``(model_input, target)`` of ``split`` when the sampling admits it."""
        training = split == "train"
        first = self._epoch.setdefault(split, epoch)
        if model_input is None or epoch != first and not (training and self.cut_passes):
            return
        at = self._offered[split]
        self._offered[split] += 1
        if not self._admits(split, at):
            return
        kept = _batch_tensors(model_input, target)
        if kept is None:
            return
        tensors, names = kept
        source = _first_tensor(model_input)
        if not training and (any(r() is source for r in self._val_sources) or any(
                same_memory(tensors[0], b[0][0]) for b in self.val_batches)):
            return  # the same validation tensor evaluated again (a loop whose epochs are not
            # seen): its rows are kept already (the user's tensor itself, or a CPU view of it)
        if not training and source is not None:
            try:
                self._val_sources.append(weakref.ref(source))
            except TypeError:
                pass
        if self.input_names is None:
            self.input_names = names
        if names == self.input_names:  # one call signature for every kept batch
            (self.train_batches if training else self.val_batches).append(
                (tensors, target.detach().cpu()))
            self._kept_at[split].append(at)
            self._samples[split] += int(target.shape[0])

    def _admits(self, split: str, at: int) -> bool:
        """Whether the batch at position ``at`` of the sampling epoch is kept.

        The first :data:`HEAD` always (while there is room); after them, one in ``stride``.
        A full sample drops every other batch past the head and doubles the stride, over at
        most ``MAX_BATCHES * SPREAD`` batches, when a ``DataLoader`` feeds training (its epochs
        are seen); a head that fills it alone keeps it as it is.
        """
        if at >= MAX_BATCHES * SPREAD or at >= HEAD and (at - HEAD) % self._stride[split]:
            return False
        batches = self.train_batches if split == "train" else self.val_batches
        if self._samples[split] < MAX_SAMPLES and len(batches) < MAX_BATCHES:
            return True
        if at < HEAD or self.train_loader is None:
            return False  # (no loader: a hand loop's epochs are not seen, a spread would
            # take the next epoch's copies of the same rows)
        stride = 2 * self._stride[split]
        keep = [i for i, k in enumerate(self._kept_at[split]) if k < HEAD or
                (k - HEAD) % stride == 0]
        if len(keep) == len(batches):
            return False  # nothing past the head to thin
        batches[:] = [batches[i] for i in keep]
        self._kept_at[split] = [self._kept_at[split][i] for i in keep]
        self._samples[split] = sum(int(b[1].shape[0]) for b in batches)
        self._stride[split] = stride
        return (at - HEAD) % stride == 0 and self._samples[split] < MAX_SAMPLES and \
            len(batches) < MAX_BATCHES


def _first_tensor(model_input):
    """The first positional tensor the model was called with (None without one)."""
    try:
        args = model_input[0]
        return args[0] if args and hasattr(args[0], "data_ptr") else None
    except (TypeError, IndexError):
        return None


def same_memory(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` are the same rows in memory.

    A kept tensor's storage is alive, so its address cannot have been reused.
    """
    try:
        return a.device == b.device and a.shape == b.shape and a.dtype == b.dtype and \
            a.stride() == b.stride() and a.data_ptr() == b.data_ptr()
    except (RuntimeError, AttributeError):
        return False


def same_values(a, b) -> bool:
    """Whether tensor ``a`` holds ``b``'s values (NaN equal to NaN; the HF ``labels`` input)."""
    if a is b:
        return True
    try:
        if a.numel() != b.numel():
            return False
        a, b = a.detach().reshape(-1), b.detach().reshape(-1)
        both_nan = a.isnan() & b.isnan() if a.is_floating_point() and b.is_floating_point() \
            else False
        return bool(((a == b) | both_nan).all())
    except (RuntimeError, TypeError, AttributeError):
        return False


def _batch_tensors(model_input, target) -> tuple[tuple, tuple] | None:
    """The model's batch inputs as one tuple of tensors and the keywords of the trailing ones.

    ``model(x)`` gives ``((x,), ())``; ``model(input_ids=..., attention_mask=..., labels=...)``
    (Hugging Face) gives ``((ids, mask), ("input_ids", "attention_mask"))``: keyword tensors
    with the batch's rows, except the target itself (the loss is computed from the output).
    None when there is no batch input (no tensor with the target's rows).
    """
    if not target.dim():
        return None
    args, kwargs = model_input
    rows = target.shape[:1]
    positional = []
    for a in args:
        if not (hasattr(a, "shape") and a.shape[:1] == rows):
            break  # a non-batch positional argument ends what can be replayed
        positional.append(a.detach().cpu())
    if len(positional) < len(args):
        return None if not positional else (tuple(positional), ())
    names, named = [], []
    for key, v in (kwargs or {}).items():
        if hasattr(v, "shape") and getattr(v, "dim", lambda: 0)() and v.shape[:1] == rows and \
                not same_values(v, target):
            names.append(str(key))
            named.append(v.detach().cpu())
    if not positional and not named:
        return None
    return tuple(positional) + tuple(named), tuple(names)


TRAIN_PASS = 0.9  # an evaluation batch holding this share of the kept training rows


def _row_keys(batches) -> set[bytes]:
    """The distinct first-input rows of kept batches, as bytes (empty when they do not flatten)."""
    try:
        return {r.tobytes() for b in batches for r in np.ascontiguousarray(
            b[0][0].double().reshape(len(b[1]), -1).cpu().numpy() + 0.0)}
    except (ValueError, RuntimeError, AttributeError, TypeError, IndexError):
        return set()


def _arrays(batches) -> tuple | None:
    """``(X, y)`` of kept ``(inputs, target)`` tensor batches.

    The first input is flattened per row; each distinct row appears once (epochs over a small
    dataset repeat rows).
    """
    if not batches:
        return None
    try:
        xs = np.concatenate([b[0][0].float().reshape(len(b[1]), -1).cpu().numpy() for b in batches])
        ys = np.concatenate([b[1].cpu().numpy() for b in batches])
    except (ValueError, RuntimeError, AttributeError, TypeError):
        return None
    _, first = np.unique(xs, axis=0, return_index=True)
    first.sort()
    return xs[first], ys[first]


def _positional(name: str, extra) -> dict:
    order = {"cross_entropy": ("weight",), "nll_loss": ("weight",),
             "binary_cross_entropy": ("weight",)}.get(name, ())
    return dict(zip(order, extra))


def describe_loss_input(name: str, input) -> dict:
    """What the loss received: logits, probabilities, log-probabilities, [0, 1] or a constant.

    ``zero_share`` is the share of exact zeros (a ReLU's floor).
    """
    import torch

    with torch.no_grad():
        x = input.detach().float()
        lo, hi = float(x.min()), float(x.max())
        kind = "logits"
        if x.dim() > 1 and x.shape[1] > 1:
            rows = x.sum(1)
            dev = float((rows - 1).abs().max())
            if lo >= 0 and dev < 1e-3:
                kind = "probabilities"
            else:
                dev_log = float((torch.logsumexp(x, 1)).abs().max())
                if hi <= 0 and dev_log < 1e-3:
                    kind, dev = "log_probabilities", dev_log
        else:
            dev = None
            if hi - lo <= 1e-6 * max(1.0, abs(hi)):
                kind = "constant"  # one value: nothing to tell about an output activation
            elif lo >= 0 and hi <= 1:
                kind = "unit_interval"
        zeros = float((x == 0).float().mean())
    return {"name": name, "kind": kind, "min": lo, "max": hi, "row_sum_dev": dev,
            "zero_share": zeros}
