"""Loss observations for the PyTorch instrument: target statistics and validation losses.

Targets seen by the training loss give the constant predictor's loss (label prior entropy, target
variance: a ``targets`` event); losses computed under ``no_grad`` become the automatic
``eval_loss`` metric. :class:`LossHooks` (mixed into ``TorchInstrument``) wraps the loss
functionals (``F.cross_entropy``, ``F.mse_loss``, ...): it records the loss line (``ref``), feeds
:class:`LossStats`, gives the keeper the loss call and its batch for Isolate (a ``loss_input``
event describes the input the loss received) and keeps the last training loss call, so that a
non-finite loss can be replayed on the same batch.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch

from ._util import PRESSED
from .codeloc import user_location

CLASS_LOSSES = ("cross_entropy", "nll_loss")
BINARY_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_with_logits")
REG_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
ELEMENTWISE = REG_LOSSES + BINARY_LOSSES  # prediction and target compared element by element
_MAX_CLASSES = 1000
_TARGET_QUEUE = 32  # targets kept (copied) and reduced together: ~2 tensor ops per step, no sync
_TARGET_QUEUE_NUMEL = 1 << 16  # larger targets (images, ...) are reduced right away
_ALL_BATCHES = 32  # targets of the first training batches are all counted, then every 8th
_SAMPLE_EVERY = 8
PAIRING_STEPS = (2, 5, 11, 23, 47)  # steps at which one training output's gradient is read
PAIRING_ROWS = 16  # ... when it is one column of at least this many rows


class LossStats:
    """Statistics of what the loss functions saw during one capture.

    Parameters
    ----------
    rec : Recorder
        Where ``targets`` events and ``eval_loss`` metrics go.
    ref : callable
        ``ref(kind, location, **extra)`` records a code reference (the loss line).
    """

    def __init__(self, rec, ref: Callable) -> None:
        self.rec = rec
        self._ref = ref
        # target statistics stay on the target's device until a ``targets`` event is written
        self.targets = {"loss": None, "classes": None, "counts": None, "moments": None, "n": 0,
                        "sampled": 0, "queue": []}
        self.eval_losses: list[tuple[torch.Tensor, int]] = []
        self._calls = 0

    def observe(self, name, input, target, out) -> None:
        """Accumulate target statistics without a device sync (read in :meth:`emit`).

        Every training batch counts up to ``_ALL_BATCHES``, then every ``_SAMPLE_EVERY``-th:
        the label prior and target variance need a sample, not every batch of a long run.
        """
        if not isinstance(target, torch.Tensor):
            return
        if not torch.is_grad_enabled():
            if out.numel() == 1:
                self.eval_losses.append((out.detach(), int(target.shape[0]) if target.dim() else 1))
            return
        t = self.targets
        if t["loss"] is None:
            t["loss"] = name
            self._ref("loss_fn", user_location(sys._getframe()), name=name)
        if t["loss"] != name:
            return
        t["n"] += int(target.numel())
        self._calls += 1
        if self._calls > _ALL_BATCHES and self._calls % _SAMPLE_EVERY:
            return
        classes = None
        if name in CLASS_LOSSES and target.dtype in (torch.long, torch.int, torch.int16):
            classes = int(input.shape[1] if input.dim() > 1 else input.shape[0])
            if classes > _MAX_CLASSES:
                return
        if classes != t["classes"]:
            self.reduce()
            t["classes"] = classes
        if name in ELEMENTWISE and isinstance(input, torch.Tensor) and input.numel():
            self._observe_input(input)
        big = target.numel() > _TARGET_QUEUE_NUMEL
        t["queue"].append(target.detach() if big else target.detach().clone())
        t["sampled"] += int(target.numel())
        if big or len(t["queue"]) >= _TARGET_QUEUE:
            self.reduce()

    def _observe_input(self, input: torch.Tensor) -> None:
        """Fold the loss input's range, exact zeros and saturation into ``inputs`` (no sync).

        Over the run, not only the first batch: an output floored by a ReLU shows its zeros, a
        sigmoid or tanh its bound, once training pushes the output against them. Only a
        prediction counts (an input that requires grad: ``mse_loss(y, pred)`` swaps them).
        """
        if not input.requires_grad:
            return
        with torch.no_grad():
            x = input.detach()
            near = 1.0 - PRESSED
            got = torch.stack([(x == 0).sum().double(),
                               torch.full((), float(x.numel()), dtype=torch.float64,
                                          device=x.device),
                               x.min().double(), x.max().double(),
                               (x >= near).sum().double(), (x <= -near).sum().double(),
                               ((x >= 0) & (x <= PRESSED)).sum().double()])
            prev = self.targets.get("inputs")
            if prev is not None and prev.device == got.device:
                got = torch.cat([prev[:2] + got[:2], torch.minimum(prev[2:3], got[2:3]),
                                 torch.maximum(prev[3:4], got[3:4]), prev[4:] + got[4:]])
            self.targets["inputs"] = got

    def weighted(self, name: str, kwargs: dict) -> None:
        """Note a weighted training loss: ``weighted``, and how (``weights``).

        ``"class"``: ``weight=`` of a cross-entropy (a weighted mean: an untrained model's loss
        stays ``ln C``); ``"pos_weight"`` with its value, one for every output column (a binary
        cross-entropy's positives weighted, not renormalised); ``"element"``: any other
        rescaling (per-column positive weights included). Read once per weight tensor.
        """
        t = self.targets
        t["weighted"] = True
        weight, pos = kwargs.get("weight"), kwargs.get("pos_weight")
        key = (name, id(weight), id(pos))
        if t.get("weights_key") == key:
            return  # read once per weight tensor (a read is a device sync)
        t["weights_key"] = key
        if weight is None and isinstance(pos, torch.Tensor) and pos.numel() and \
                name == "binary_cross_entropy_with_logits" and \
                bool((pos.detach() == pos.detach().reshape(-1)[0]).all()):
            # one weight for every output column (per-column weights: their own scales)
            how = ("pos_weight", float(pos.detach().reshape(-1)[0]))
        elif pos is None and name in CLASS_LOSSES:
            how = ("class", None)
        else:
            how = ("element", None)
        if t.get("weights") not in (None, how):
            how = ("element", None)  # weighted two ways over the run: no single scale
        t["weights"] = how

    def counting_all(self) -> bool:
        """Whether every training batch is still counted (see :meth:`observe`)."""
        return self._calls < _ALL_BATCHES

    def count(self, name, input, target, out) -> None:
        """The steady state of :meth:`observe`: count the batch, observe every k-th."""
        self._calls += 1
        if self._calls % _SAMPLE_EVERY:
            self.targets["n"] += target.numel()
        else:
            self._calls -= 1
            self.observe(name, input, target, out)

    def reduce(self) -> None:
        """Fold the queued targets into class counts or moments, on their device.

        The moments are the sum, the sum of squares and the counts of targets below 0, above 1
        and below -1.
        """
        t = self.targets
        queue, t["queue"] = t["queue"], []
        if not queue:
            return
        try:
            with torch.no_grad():
                flat = torch.cat([q.reshape(-1) for q in queue])
                classes = t["classes"]
                if classes is not None:
                    # bin 0: negative (ignore_index), bins 1..classes: the classes, last: beyond
                    idx = flat.long().add_(1).clamp_(0, classes + 1)
                    counts = torch.zeros(classes + 2, dtype=torch.long, device=idx.device)
                    counts.index_add_(0, idx, torch.ones((), dtype=torch.long,
                                                         device=idx.device).expand(idx.numel()))
                    prev = t["counts"]
                    same = prev is not None and prev.shape == counts.shape \
                        and prev.device == counts.device
                    t["counts"] = prev + counts if same else counts
                else:
                    f = flat.float()
                    moments = torch.stack([f.sum(), torch.dot(f, f), (f < 0).sum(),
                                           (f > 1).sum(), (f < -1).sum()]).double()
                    prev = t["moments"]
                    same = prev is not None and prev.device == moments.device
                    t["moments"] = prev + moments if same else moments
        except Exception:  # noqa: BLE001 - statistics must never break training
            pass

    def flush_eval(self) -> None:
        """Record the mean loss of the validation pass just finished (``eval_loss``)."""
        if self.eval_losses:
            total = sum(float(v) * n for v, n in self.eval_losses)
            count = sum(n for _, n in self.eval_losses)
            self.eval_losses = []
            if count:
                self.rec.metric("eval_loss", total / count, "auto")

    def emit(self) -> None:
        """Write a ``targets`` event (class counts or mean/variance) for the baselines."""
        t = self.targets
        if t["loss"] is None or not t["n"]:
            return
        self.reduce()
        data = {"loss": t["loss"], "n": t["n"]}
        if t.get("reduction"):
            data["reduction"] = t["reduction"]
        if t.get("weighted"):
            data["weighted"] = True
            kind, value = t.get("weights") or ("element", None)
            data["weights"] = kind
            if value is not None:
                data["pos_weight"] = value
        if t["sampled"] < t["n"]:
            data["sampled"] = t["sampled"]  # the statistics below come from this many targets
        if t.get("inputs") is not None:
            zeros, numel, low, high, near_one, near_minus_one, near_zero = t["inputs"].tolist()
            numel = max(numel, 1.0)
            data["input_min"], data["input_max"] = low, high
            data["input_zero_share"] = zeros / numel
            # shares of the outputs pressed against a sigmoid's or tanh's bounds
            data["input_pressed"] = {"1": near_one / numel, "-1": near_minus_one / numel,
                                     "0": near_zero / numel}
        if t["counts"] is not None:
            data["counts"] = [int(c) for c in t["counts"][1:-1].tolist()]
        elif t["moments"] is not None:
            total, sumsq, negative, above_one, below_minus_one = t["moments"].tolist()
            data["mean"] = total / t["sampled"]
            data["var"] = max(sumsq / t["sampled"] - data["mean"] ** 2, 0.0)
            # the shares outside the ranges bounded outputs have: [0, inf), [0, 1], [-1, 1]
            data["negative"] = negative / t["sampled"]
            data["above_one"] = above_one / t["sampled"]
            data["below_minus_one"] = below_minus_one / t["sampled"]
        else:
            return
        self.rec.emit("targets", **data)


class LossHooks:
    """The loss functionals, wrapped. State owned here: :attr:`losses`, the last loss call."""

    def _init_loss_state(self) -> None:
        # target statistics stay on the target's device until a ``targets`` event is written
        self.losses = LossStats(self.rec, self.ref)
        self._last_loss_call = None
        self._steady_loss = None  # the training loss's name once there is nothing left to keep
        self._broadcast_seen: set[str] = set()
        self._in_loss = False  # inside a wrapped loss call (a mode re-dispatches it)
        self._offset_seen = False
        self._pairing_steps: set[int] = set()

    def _let_go_loss(self) -> None:
        self._last_loss_call = None

    def _wrap_loss(self, original, name: str):
        link = self._link

        def loss_fn(input, target, *args, **kwargs):
            inst = link.target  # (an attribute: read on every call)
            if inst is None or inst._in_loss:  # (a TorchFunctionMode dispatches the call
                return original(input, target, *args, **kwargs)  # to the module's name: here)
            inst._in_loss = True
            try:
                out = original(input, target, *args, **kwargs)
            finally:
                inst._in_loss = False
            try:
                if inst._steady_loss == name and torch.is_grad_enabled():
                    # nothing left to keep: the replay's loss call, and the targets counted
                    inst._last_loss_call = (name, target, kwargs, input.shape)
                    inst.losses.count(name, input, target, out)
                else:
                    if kwargs.get("reduction") == "sum" and torch.is_grad_enabled():
                        inst.losses.targets["reduction"] = "sum"  # not on the baselines' scale
                    if torch.is_grad_enabled() and (kwargs.get("weight") is not None or
                                                    kwargs.get("pos_weight") is not None):
                        inst.losses.weighted(name, kwargs)  # class weights: nor this
                    inst.losses.observe(name, input, target, out)
                    inst._keep_loss(name, input, target, args, kwargs)
                    inst._check_broadcast(name, input, target)
                    inst._check_offset(name, input, target, kwargs)
            except Exception:  # noqa: BLE001 - observation must never break training
                pass
            return out

        loss_fn.__wrapped__ = original
        return loss_fn

    def _check_broadcast(self, name, input, target) -> None:
        """A ``loss_broadcast`` event (once per loss) when a loss pairs by broadcasting.

        An elementwise training loss given ``(B, 1)`` predictions against a ``(B,)`` target
        compares every prediction with every target, ``B x B`` terms: the model learns their
        mean.
        """
        if name in self._broadcast_seen or name not in ELEMENTWISE or not torch.is_grad_enabled() \
                or not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor) \
                or input.shape == target.shape:
            return
        try:
            shape = torch.broadcast_shapes(input.shape, target.shape)
        except RuntimeError:
            return  # not broadcastable: the loss itself raised
        terms = math.prod(shape)
        if terms <= max(input.numel(), target.numel()):
            return  # one side is a scalar or a size-1 weight: no pairing changed
        self._broadcast_seen.add(name)
        self.rec.emit("loss_broadcast", loss=name, input=list(input.shape),
                      target=list(target.shape), shape=list(shape),
                      factor=terms / max(input.numel(), target.numel(), 1),
                      location=user_location(sys._getframe()))

    def _check_offset(self, name, input, target, kwargs) -> None:
        """A ``target_offset`` event (once) for a token loss over the model's own input tokens.

        The first training cross-entropy whose targets hold a row of ``T`` class ids per row of
        an integer ``(B, T)`` model input (token ids): the share of the counted targets
        (``ignore_index`` left out) equal to the input token ``s`` positions on, for ``s`` in
        0-3. Next-token prediction pairs each position with the token after it (``s = 1``,
        after any shift the model itself does); ``0`` asks for the token it is given, ``2``
        for the one after next (labels shifted twice).
        """
        if self._offset_seen or name not in ("cross_entropy", "nll_loss") or \
                not torch.is_grad_enabled() or self._last_input is None or \
                target.is_floating_point() or target.dim() == 0:
            return
        args, kw = self._last_input
        named = [kw.get("input_ids")] + list(args) + [v for k, v in kw.items() if k != "labels"]
        tokens = next((t for t in named if isinstance(t, torch.Tensor) and t.dim() == 2
                       and not t.is_floating_point() and t.shape[1] >= 4), None)
        if tokens is None or target.numel() != tokens.numel():
            return
        self._offset_seen = True
        ignore = kwargs.get("ignore_index", -100)
        with torch.no_grad():
            t, x = target.detach().reshape(tokens.shape), tokens.detach()
            length = x.shape[1]
            counted = t != ignore
            matches = {}
            for s in range(4):
                kept = counted[:, :length - s]
                n = int(kept.sum())
                if length - s < 2 or not n:
                    break
                matches[str(s)] = float(((t[:, :length - s] == x[:, s:]) & kept).sum()) / n
        classes = input.shape[1] if input.dim() > 2 and target.dim() == input.dim() - 1 \
            else input.shape[-1] if input.dim() >= 2 else None  # ((N, C, T) or (N*T, C))
        self.rec.emit("target_offset", loss=name, rows=int(x.shape[0]), length=int(length),
                      classes=int(classes) if classes is not None else None,
                      counted=int(counted.sum()), matches=matches,
                      location=user_location(sys._getframe()))

    def _watch_pairing(self, out: torch.Tensor) -> None:
        """Read the gradient a one-column training output receives, at a few steps.

        Whatever computes the loss (a hand-written ``((pred - y) ** 2).mean()`` included), a
        loss that compares each prediction with its own target gives each row a gradient that
        depends on that row's target; one that broadcasts ``(B, 1)`` against ``(B,)`` gives
        ``2 (pred_i - mean(y)) / B``, a function of the prediction alone. An ``output_grads``
        event per step read: the rank correlation of the gradient with the prediction (1:
        monotone in the prediction alone), their correlation (1: affine in it) and the slope
        (``2 / B`` for a squared error averaged over all ``B x B`` pairs), None when either is
        constant. Only while no loss function the capture knows was called in
        training: those it watches itself (``loss_broadcast``).
        """
        step = self.rec.step
        if step not in PAIRING_STEPS or step in self._pairing_steps or not out.requires_grad \
                or self.losses.targets["loss"] is not None \
                or out.ndim not in (1, 2) or (out.ndim == 2 and out.shape[1] != 1) \
                or out.shape[0] < PAIRING_ROWS:
            return
        self._pairing_steps.add(step)
        values = out.detach().reshape(-1).float()
        link = self._link

        def hook(grad):
            inst = link()
            if inst is not None:
                inst.guard(inst._read_pairing)(step, values, grad)

        out.register_hook(hook)

    def _read_pairing(self, step: int, values: torch.Tensor, grad: torch.Tensor) -> None:
        g = grad.detach().reshape(-1).float()
        if g.numel() != values.numel() or not bool(torch.isfinite(g).all()):
            return
        rho = r = slope = None
        if float(g.std()) > 1e-9 * float(g.abs().max()) and float(values.std()) > 0:
            ranks = torch.stack([values.argsort().argsort(), g.argsort().argsort()]).float()
            rho = float(torch.corrcoef(ranks)[0, 1])
            r = float(torch.corrcoef(torch.stack([values, g]))[0, 1])
            centred = values - values.mean()
            slope = float((centred * (g - g.mean())).sum() / (centred * centred).sum())
        self.rec.emit("output_grads", step=step, rows=int(g.numel()),
                      rank_corr=rho if rho is not None and math.isfinite(rho) else None,
                      corr=r if r is not None and math.isfinite(r) else None,
                      slope=slope if slope is not None and math.isfinite(slope) else None)

    def _keep_loss(self, name, input, target, args, kwargs) -> None:
        if not isinstance(target, torch.Tensor) or not isinstance(input, torch.Tensor):
            return
        if self.losses.targets["loss"] not in (None, name):
            return
        if torch.is_grad_enabled():
            self._last_loss_call = (name, target, kwargs, input.shape)
        training = torch.is_grad_enabled()
        described = self.keeper.on_loss(name, input, target, args, kwargs, self._last_input,
                                        training, self.rec.epoch)
        if described is not None:
            self.rec.emit("loss_input", **described)
        if training and self.losses.targets["loss"] == name and \
                not self.losses.counting_all() and not self.keeper.sampling(True, self.rec.epoch):
            self._steady_loss = name  # the training loss from now on takes the short path
