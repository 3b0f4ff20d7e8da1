"""The PyTorch :class:`~model_debugger.trainers.Trainer`: copies of the user's model, trained.

Nothing here touches the user's objects: every probe trains a deep copy restored to the weights
captured before the first optimizer step, with the user's optimizer class and hyperparameters
(or an override) and the user's loss function. Importing this module imports torch.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from .base import SampleTrainer, dropped_calls, init_outlier

AFFINE = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)  # affine layers


def _starts_chain(module) -> bool:
    """Whether an affine layer without activation after it is suspect.

    Not a convolution that is grouped (a depthwise convolution before its pointwise one) or
    that narrows the channels (a linear bottleneck's projection): designs that leave the
    activation out on purpose.
    """
    if isinstance(module, torch.nn.Linear):
        return True
    return module.groups == 1 and module.out_channels >= module.in_channels


def from_keeper(keeper) -> TorchTrainer | None:
    """A trainer on a :class:`~model_debugger.capture.keeper.Keeper`'s objects, or None.

    None when they cannot train a copy (a loss the functional API does not name, batches that
    do not stack).
    """
    try:
        return TorchTrainer(keeper.model, keeper.initial_state, keeper.optimizer, keeper.loss,
                            keeper.train_batches, keeper.validation_batches(),
                            getattr(keeper, "input_names", None) or ())
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return None


class TorchTrainer(SampleTrainer):
    """Train and evaluate copies of a captured model.

    Parameters
    ----------
    model : torch.nn.Module
        The user's model (only copied, never modified).
    initial_state : dict
        ``state_dict`` copy taken before the first optimizer step.
    optimizer : dict
        ``{"cls": optimizer class, "hyper": {...}}`` as captured.
    loss : dict
        ``{"name": functional name, "kwargs": {...}, "out_shape": tuple or None}``.
    train_batches, val_batches : list of (inputs tuple, target) pairs
        Samples seen by the loss during training / validation.
    input_names : tuple of str
        Keywords of the last ``len(input_names)`` inputs: a model called as
        ``model(input_ids=..., attention_mask=...)`` (Hugging Face) is called so again.
    """

    framework = "torch"
    max_norm: float | None = None  # the copies' gradient-norm clip (:meth:`with_settings`)

    def __init__(self, model, initial_state, optimizer, loss, train_batches, val_batches=(),
                 input_names=()):
        self.model = model
        self.input_names = tuple(input_names)
        self.initial_state = initial_state
        self.opt_cls = optimizer.get("cls") or torch.optim.Adam
        ids = optimizer.get("param_ids") or frozenset()
        names = {n for n, p in model.named_parameters() if id(p) in ids}
        # the parameters the user's optimizer updates, when it leaves some of the model out
        self.trained_names = frozenset(names) if 0 < len(names) < sum(
            1 for _ in model.parameters()) else None
        self.hyper = dict(optimizer.get("hyper") or {"lr": 1e-3})
        self.loss_fn = getattr(torch.nn.functional, loss["name"])
        self.loss_kwargs = dict(loss.get("kwargs") or {})
        self.loss_input_shape = loss.get("input_shape")
        self.inputs, self.targets = _stack(train_batches)
        self.val_inputs, self.val_targets = _stack(val_batches) if val_batches else (None, None)

    @property
    def adam(self):
        """The Adam class, for probes that train with a fixed, well-behaved optimizer."""
        return torch.optim.Adam

    def fresh_model(self):
        """A deep copy of the model with its initial weights, on the CPU, in train mode."""
        m = copy_model(self.model).to("cpu")
        if self.initial_state is not None:
            m.load_state_dict(self.initial_state)
        m.train()
        return m

    def optimizer(self, model, lr: float | None = None, cls=None):
        """A new optimizer of the user's class and settings on ``model`` (``lr``/``cls`` override).

        Only the rate carries over when the settings do not fit the class.
        """
        hyper = dict(self.hyper)
        if lr is not None:
            hyper["lr"] = lr
        cls = cls or self.opt_cls
        params = list(model.parameters())
        if self.trained_names is not None and not getattr(model, "_md_every_param", False):
            params = [p for n, p in model.named_parameters() if n in self.trained_names]
        try:
            return cls(params, **hyper)
        except TypeError:
            return cls(params, lr=hyper.get("lr", 1e-3))

    def settings(self) -> dict:
        """The optimizer settings a probe may suspect, by framework-neutral name.

        ``weight_decay``, ``momentum`` and ``beta1`` (None where the optimizer has none), and
        ``clip``, the copies' gradient-norm clip (the loop's clip is in the record, not here).
        """
        betas = self.hyper.get("betas")
        return {"weight_decay": self.hyper.get("weight_decay"),
                "momentum": self.hyper.get("momentum"),
                "beta1": betas[0] if isinstance(betas, (tuple, list)) and betas else None,
                "clip": self.max_norm}

    def without_loss_weights(self) -> TorchTrainer:
        """A copy of the trainer whose loss has no ``weight=`` or ``pos_weight=``."""
        new = copy.copy(self)
        new.loss_kwargs = {k: v for k, v in self.loss_kwargs.items()
                           if k not in ("weight", "pos_weight")}
        return new

    def with_settings(self, **changes) -> TorchTrainer:
        """A copy of the trainer with some of :meth:`settings` changed (``clip=None``: no clipping)."""
        new = copy.copy(self)
        new.hyper = dict(self.hyper)
        for name, value in changes.items():
            if name == "clip":
                new.max_norm = value
            elif name == "beta1":
                betas = tuple(self.hyper.get("betas") or (0.9, 0.999))
                new.hyper["betas"] = (value, *betas[1:])
            elif name in ("weight_decay", "momentum"):
                new.hyper[name] = value
            else:
                raise ValueError(f"unknown optimizer setting {name!r}")
        return new

    def init_outliers(self) -> dict[str, dict]:
        """Initial weights far from what the framework's own initialisation would give.

        Each module's parameters before the first step are compared with a copy of the module
        re-initialised by its ``reset_parameters`` (:func:`init_outlier`). Embeddings are not
        judged (a small normal init of embeddings is the transformer norm).
        """
        model = self.fresh_model()
        out: dict[str, dict] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for name, m in model.named_modules():
                own = dict(m.named_parameters(recurse=False))
                if not own or isinstance(m, torch.nn.Embedding) or \
                        not callable(getattr(m, "reset_parameters", None)):
                    continue
                ref = copy.deepcopy(m)
                try:
                    ref.reset_parameters()
                except Exception:  # noqa: BLE001 - a custom reset that cannot run on a copy
                    continue
                fresh = dict(ref.named_parameters(recurse=False))
                for pname, p in own.items():
                    odd = init_outlier(p.detach().float().numpy(),
                                       fresh[pname].detach().float().numpy())
                    if odd is not None:
                        out[f"{name}.{pname}" if name else pname] = odd
        return out

    @staticmethod
    def default_init(model):
        """Re-initialise every module of ``model`` (a copy) by its ``reset_parameters``."""
        with torch.no_grad():
            for m in model.modules():
                if callable(getattr(m, "reset_parameters", None)) and \
                        next(m.parameters(recurse=False), None) is not None:
                    try:
                        m.reset_parameters()
                    except Exception:  # noqa: BLE001 - a custom reset that cannot run
                        pass
        return model

    def forward(self, model, inputs):
        """``model`` called on ``inputs`` as the user's code called it (keywords included)."""
        k = len(self.input_names)
        if not k:
            return model(*inputs)
        return model(*inputs[:len(inputs) - k], **dict(zip(self.input_names, inputs[-k:])))

    def loss(self, model, inputs, target) -> torch.Tensor:
        """The user's loss on the model's output, the output reshaped as the loss saw it."""
        out = _main_output(self.forward(model, inputs), self.loss_input_shape)
        if self.loss_input_shape is not None and tuple(out.shape[1:]) != \
                tuple(self.loss_input_shape):
            out = out.reshape(out.shape[0], *self.loss_input_shape)
        loss = self.loss_fn(out, target, **self.loss_kwargs)
        return loss if loss.dim() == 0 else loss.mean()  # reduction="none" in the user's code

    def predict(self, model, inputs) -> np.ndarray:
        """``model``'s outputs on ``inputs`` in inference mode, shaped as the loss read them."""
        was = model.training
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        parts = []
        model.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(inputs[0]), PREDICT_ROWS):  # the model's device, in chunks
                    chunk = tuple(x[i:i + PREDICT_ROWS].to(device) for x in inputs)
                    out = _main_output(self.forward(model, chunk), self.loss_input_shape)
                    if self.loss_input_shape is not None and tuple(out.shape[1:]) != \
                            tuple(self.loss_input_shape):
                        out = out.reshape(out.shape[0], *self.loss_input_shape)
                    parts.append(out.detach().float().cpu().numpy())
        finally:
            model.train(was)
        return np.concatenate(parts)

    def subset(self, idx):
        """``(inputs, target)`` rows ``idx`` of the training sample."""
        return tuple(x[idx] for x in self.inputs), self.targets[idx]

    def randperm(self, n: int, seed: int) -> torch.Tensor:
        """A seeded permutation of ``range(n)`` (row indices for :meth:`subset`)."""
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))

    def fit(self, model, inputs, target, steps: int, lr: float | None = None, batch_size: int = 64,
            seed: int = 0, opt_cls=None, stop_below: float | None = None,
            check=None, every: int = 10, shuffle: bool = True) -> list[float]:
        """Train ``model`` in place for ``steps`` minibatch steps; return the loss per step.

        Stops early when the loss is non-finite or below ``stop_below``. ``check(model)``, when
        given, is called every ``every`` steps and after the last one (to watch held-out rows).
        With ``shuffle=False`` the batches are consecutive rows in their given order, over and
        over (a loader that never shuffles).
        """
        g = torch.Generator().manual_seed(seed)
        opt = self.optimizer(model, lr, opt_cls)
        n = int(target.shape[0])
        losses: list[float] = []
        model.train()
        for i in range(steps):
            self.on_time()
            if n <= batch_size:
                idx = slice(None)
            elif shuffle:
                idx = torch.randperm(n, generator=g)[:batch_size]
            else:
                idx = torch.arange(i * batch_size, (i + 1) * batch_size) % n
            opt.zero_grad(set_to_none=True)
            loss = self.loss(model, tuple(x[idx] for x in inputs), target[idx])
            value = float(loss.detach())
            losses.append(value)
            if not math.isfinite(value) or (stop_below is not None and value < stop_below):
                break
            loss.backward()
            if self.max_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm)
            opt.step()
            if check is not None and (len(losses) % every == 0 or len(losses) == steps):
                check(model)
        return losses

    def param_count(self) -> int:
        """Parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())

    def frozen_share(self) -> float:
        """Share of the model's parameters (by count) that do not train.

        ``requires_grad`` off, or left out of the user's optimizer.
        """
        total = self.param_count()
        left_out = self.trained_names
        frozen = sum(p.numel() for n, p in self.model.named_parameters()
                     if not p.requires_grad or left_out is not None and n not in left_out)
        return frozen / total if total else 0.0

    def dropout_rates(self) -> dict[str, float]:
        """The drop probability of every dropout module, by module name."""
        return {name or "model": float(m.p) for name, m in self.model.named_modules()
                if isinstance(m, torch.nn.modules.dropout._DropoutNd)}

    @staticmethod
    def unfreeze(model):
        """Make every parameter of ``model`` (a copy) train, in its optimizer too; returns it."""
        for p in model.parameters():
            p.requires_grad_(True)
        model._md_every_param = True  # (read by :meth:`optimizer`)
        return model

    @staticmethod
    def all_in_optimizer(model):
        """Give ``model``'s (a copy's) optimizer every parameter; frozen ones stay frozen."""
        model._md_every_param = True  # (read by :meth:`optimizer`)
        return model

    @staticmethod
    def without_dropout(model):
        """Set every dropout of ``model`` (a copy) to drop nothing; returns it."""
        for m in model.modules():
            if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                m.p = 0.0
        return model

    def linear_chains(self) -> list[tuple[str, str]]:
        """Pairs of affine modules (``nn.Linear``, ``nn.Conv*d``) where the second is fed the first's output.

        With nothing between them but dropout, an identity, a flatten, a batch norm or an
        average pool: two affine maps in a row are one affine map, so the first adds no
        capacity. Traced on one forward pass of a fresh copy in eval mode by the tensors each
        module got and gave (every tensor is kept alive during the pass, so an id names one
        tensor, and its version counter tells an in-place activation, ``ReLU(inplace=True)``
        or ``x.relu_()``, that changed it since); an activation, written as a module or a
        function, or a max pool breaks the chain.

        Returns
        -------
        list of (str, str)
            Module names, each pair once, in the order the pass met them.
        """
        nn = torch.nn
        passing = (nn.modules.dropout._DropoutNd, nn.Identity, nn.Flatten,
                   nn.modules.batchnorm._BatchNorm, nn.modules.pooling._AvgPoolNd,
                   nn.modules.pooling._AdaptiveAvgPoolNd)
        model = self.fresh_model().eval()
        made: dict[int, tuple[str, int]] = {}  # id -> (the layer behind it, its version)
        alive: list = []
        pairs: list[tuple[str, str]] = []

        def hook(module, inp, out, name):
            if not inp or not isinstance(inp[0], torch.Tensor) or \
                    not isinstance(out, torch.Tensor):
                return
            alive.extend((inp[0], out))
            source, version = made.get(id(inp[0]), (None, None))
            if version != inp[0]._version:
                source = None  # changed in place since (an in-place activation)
            if isinstance(module, AFFINE):
                if source is not None:
                    pairs.append((source, name))
                if _starts_chain(module):
                    made[id(out)] = (name, out._version)
            elif isinstance(module, passing) and source is not None:
                made[id(out)] = (source, out._version)

        handles = [m.register_forward_hook(lambda m, i, o, name=name: hook(m, i, o, name))
                   for name, m in model.named_modules() if name and not list(m.children())]
        try:
            with torch.no_grad():
                self.forward(model, tuple(x[:4] for x in self.inputs))
        finally:
            for h in handles:
                h.remove()
        return list(dict.fromkeys(pairs))

    def discarded_outputs(self) -> list[dict]:
        """Modules whose output the forward pass throws away while their input goes on.

        ``self.drop(x)`` written without ``x =``: the module runs, and the path to the model's
        output takes its input around it. Read from one forward pass of a fresh copy in train
        mode (dropout makes a new tensor) on a few rows: the gradient of every tensor the
        model returns reaches a module's input but none of its outputs, at every call. A
        module's outputs that reach nothing feed no returned value (a dead branch whose
        input is dead too is not this).

        Returns
        -------
        list of dict
            ``{"layer": module name, "kind": its class, "where": the user's line that
            called it, or None}``, in the order the pass met them.
        """
        from ..capture.codeloc import user_location

        model = self.fresh_model()
        calls: list[tuple[str, str, list, list, dict | None]] = []

        def hook(module, inp, out, name):
            ins = [t for t in _tensors(inp) if t.requires_grad]
            outs = [t for t in _tensors(out) if t.requires_grad and
                    not any(t is i for i in ins)]
            if outs:
                calls.append((name, type(module).__name__, ins, outs, user_location()))

        given: dict[str, int] = {}  # a module -> the id of the first tensor it was given

        def took(module, inp, name):
            if inp and isinstance(inp[0], torch.Tensor):
                given.setdefault(name, id(inp[0]))

        handles = [m.register_forward_hook(lambda m, i, o, name=name: hook(m, i, o, name))
                   for name, m in model.named_modules() if name and not list(m.children())]
        handles += [m.register_forward_pre_hook(lambda m, i, name=name: took(m, i, name))
                    for name, m in model.named_modules() if name and list(m.children())]
        rows = tuple(x[:4].detach().clone().requires_grad_(x.is_floating_point())
                     for x in self.inputs)
        try:
            returned = [t for t in _tensors(self.forward(model, rows))
                        if t.requires_grad and t.is_floating_point()]
        finally:
            for h in handles:
                h.remove()
        watched = list({id(t): t for c in calls for t in (*c[2], *c[3])}.values())
        if not returned or not watched:
            return []
        total = sum(t.float().sum() for t in returned)
        grads = torch.autograd.grad(total, watched, allow_unused=True)
        found = dropped_calls(calls, {id(t) for t, g in zip(watched, grads, strict=True)
                                      if g is not None})
        by_input = {name: c[2][0] for c in calls for name in [c[0]] if c[2]}
        for f in found:  # a block dropped whole: the outermost module given the same input
            tensor = by_input.get(f["layer"])
            outer = [n for n, at in given.items() if tensor is not None and at == id(tensor)
                     and f["layer"].startswith(n + ".")]
            if outer:
                f["layer"] = min(outer, key=len)
                f["kind"] = type(dict(model.named_modules())[f["layer"]]).__name__
        return found

    @staticmethod
    def passing_on(names):
        """``change(model)``: the output of each module named in ``names`` is passed on.

        What ``x = self.drop(x)`` would do for a forward that writes ``self.drop(x)``: every
        module called later in the pass with the very tensor such a module was given gets
        that module's output instead. Raises ValueError when the copy does not hold every one of them.
        """
        def change(model):
            found = [(n, m) for n, m in model.named_modules() if n in names]
            if len(found) != len(names):
                raise ValueError(f"the copy has {len(found)} of the layers {sorted(names)}")
            given: list[tuple] = []  # (the tensor a named module got, what it gave)
            targets = {id(m) for _, m in found}

            def gave(module, inp, out):
                if inp and isinstance(inp[0], torch.Tensor) and isinstance(out, torch.Tensor):
                    given.append((inp[0], out))

            def takes(module, inp):
                if id(module) in targets or not given or not inp:
                    return None
                for was, out in given:
                    if inp[0] is was:
                        return (out, *inp[1:])
                return None

            model.register_forward_pre_hook(lambda *_: given.clear())
            for _, m in found:
                m.register_forward_hook(gave)
            for n, m in model.named_modules():
                if n and not list(m.children()):
                    m.register_forward_pre_hook(takes)
            return model
        return change

    def linear_layers(self) -> list[str]:
        """The names of the model's affine modules (``nn.Linear``, ``nn.Conv*d``), in definition order."""
        return [name for name, m in self.model.named_modules() if isinstance(m, AFFINE)]

    @staticmethod
    def with_activations(names):
        """``change(model)``: a ReLU on the output of each module named in ``names``.

        Raises ValueError when the copy does not hold every one of them (nothing would change).
        """
        def change(model):
            found = [m for name, m in model.named_modules() if name in names]
            if len(found) != len(names):
                raise ValueError(f"the copy has {len(found)} of the layers {sorted(names)}")
            for m in found:
                m.register_forward_hook(lambda _m, _i, out: torch.relu(out))
            return model
        return change

    def sweep(self, lr_min: float, lr_max: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """A geometric learning-rate sweep from the initial weights: rates and smoothed losses.

        The rate grows from ``lr_min`` towards ``lr_max`` over (at most) ``steps`` minibatch
        steps; the sweep stops when the loss goes non-finite or the smoothed loss exceeds four
        times its minimum.
        """
        model = self.fresh_model()
        opt = self.optimizer(model, lr_min)
        g = torch.Generator().manual_seed(0)
        lrs = np.geomspace(lr_min, lr_max, self.steps_within(steps, floor=60))
        losses, smooth = [], None
        for lr in lrs:
            self.on_time()
            for group in opt.param_groups:
                group["lr"] = float(lr)
            idx = torch.randperm(self.n, generator=g)[:64]
            inputs, target = self.subset(idx)
            opt.zero_grad(set_to_none=True)
            loss = self.loss(model, inputs, target)
            value = float(loss.detach())
            if not math.isfinite(value):
                losses.append(math.inf)
                break
            smooth = value if smooth is None else 0.8 * smooth + 0.2 * value
            losses.append(smooth)
            if smooth > 4 * min(losses):
                break
            loss.backward()
            opt.step()
        return lrs[:len(losses)], np.array(losses)

    def param_bytes(self) -> int:
        """Bytes of the model's parameters."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def per_sample_bytes(self, inputs) -> float:
        """Bytes of inputs plus every module output (what backward keeps) per sample.

        Measured with one forward pass of a fresh copy.
        """
        model = self.fresh_model()
        total = [sum(x.numel() * x.element_size() for x in inputs)]

        def hook(module, inp, out):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    total[0] += t.numel() * t.element_size()

        handles = [m.register_forward_hook(hook) for m in model.modules()]
        try:
            with torch.no_grad():
                self.forward(model, inputs)
        finally:
            for h in handles:
                h.remove()
        return total[0] / max(int(inputs[0].shape[0]), 1)

    @torch.no_grad()
    def evaluate(self, model, inputs, target) -> float:
        """Loss of ``model`` on the given rows, in eval mode (restored afterwards)."""
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                return float(self.loss(model, inputs, target))
        finally:
            model.train(was)


def copy_model(model):
    """A deep copy of ``model`` without the trainer it is attached to.

    A ``LightningModule`` holds its ``Trainer`` (``_trainer``, and so the data loaders and their
    datasets): the copy gets None there instead of a copy of all of it.
    """
    memo = {}
    for m in model.modules():
        for attr in ("_trainer", "_fabric"):
            ref = m.__dict__.get(attr)
            if ref is not None:
                memo[id(ref)] = None
    return copy.deepcopy(model, memo)


def _stack(batches):
    """Concatenate ``[(inputs, target), ...]`` along the batch dimension (matching shapes only)."""
    batches = [(i, t) for i, t in batches if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not batches:
        return None, None
    batches = _padded_alike(batches)
    first_in, first_t = batches[0]
    keep = [(i, t) for i, t in batches
            if len(i) == len(first_in) and t.shape[1:] == first_t.shape[1:]
            and all(isinstance(a, torch.Tensor) and a.shape[1:] == b.shape[1:]
                    for a, b in zip(i, first_in))]
    inputs = tuple(torch.cat([i[k].detach() for i, _ in keep]) for k in range(len(first_in)))
    target = torch.cat([t.detach() for _, t in keep])
    return _finite_rows(inputs, target)


def _padded_alike(batches):
    """``batches`` whose integer sequence inputs are padded at the end to one length.

    A ``collate_fn`` with ``pad_sequence`` pads each batch to its own longest row: token ids
    of shape (rows, steps) whose steps differ from batch to batch. Such an input (integer, the
    same shape but for its steps, each shorter batch ending with id 0 in some row: padded at
    the end with 0) is padded with 0 to the longest; the batches then stack, where only those
    of the first one's length would (a handful of rows). Other inputs and the targets are left
    as they are.
    """
    first_in = batches[0][0]
    widths: dict[int, int] = {}
    for k, a in enumerate(first_in):
        if not (isinstance(a, torch.Tensor) and a.dim() >= 2 and not a.is_floating_point()
                and a.dtype != torch.bool):
            continue
        same = [i[k] for i, _ in batches if len(i) == len(first_in) and
                isinstance(i[k], torch.Tensor) and i[k].dim() == a.dim() and
                i[k].dtype == a.dtype and i[k].shape[2:] == a.shape[2:]]
        longest = max(x.shape[1] for x in same)
        if len({x.shape[1] for x in same}) > 1 and all(
                x.shape[1] == longest or bool((x[:, -1] == 0).any()) for x in same):
            widths[k] = longest
    if not widths:
        return batches

    def pad(a, k):
        if k not in widths or not isinstance(a, torch.Tensor) or a.dim() < 2 or \
                a.shape[1] >= widths[k] or a.dtype != first_in[k].dtype:
            return a
        shape = (a.shape[0], widths[k] - a.shape[1], *a.shape[2:])
        return torch.cat([a, a.new_zeros(shape)], dim=1)

    return [(tuple(pad(a, k) for k, a in enumerate(i)) if len(i) == len(first_in) else i, t)
            for i, t in batches]


PREDICT_ROWS = 256  # rows per forward when predicting


def _finite_rows(inputs: tuple, target):
    """The rows whose inputs and target hold only finite values (all rows when none does).

    A row with a NaN or inf makes every experiment on the sample diverge at any rate or
    architecture: that is the data's finding (``nonfinite_inputs``, read from the batches),
    not evidence about the model or the learning rate. Non-finite values in every row are
    kept: an additive mask holds ``-inf`` by design.
    """
    ok = torch.ones(len(target), dtype=torch.bool)
    for t in (*inputs, target):
        if len(t) == len(target) and (t.is_floating_point() or t.is_complex()):
            ok &= torch.isfinite(t.reshape(len(t), -1)).all(1)
    if bool(ok.all()) or not bool(ok.any()):  # every row: inf by design (a padding mask)
        return inputs, target
    return tuple(t[ok] if len(t) == len(target) else t for t in inputs), target[ok]


def _main_output(out, shape):
    """The tensor the loss was fed when the model returns a dict, tuple or list."""
    if isinstance(out, torch.Tensor):
        return out
    items = list(out.values()) if isinstance(out, dict) else list(out)
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    for t in tensors:
        if shape is not None and tuple(t.shape[1:]) == tuple(shape):
            return t
    if not tensors:
        raise TypeError(f"the model returned {type(out).__name__} without tensors")
    return tensors[0]


def _tensors(value) -> list:
    """The tensors in a module's inputs or outputs (tuples, lists, dicts, model outputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
