"""Trainers: one protocol for probes that train copies of the user's model, in both frameworks.

A probe that needs to train (``overfit_small_batch``, ``label_alignment``, ``lr_range``,
``seed_variance``, ``batch_memory``, ...) gets a :class:`Trainer` from its context and never
touches the user's objects: every model it trains is a fresh copy set to the weights captured
before the first step, with the user's optimizer class and settings (or an override) and the
user's loss. :func:`trainer_for` builds the trainer of a capture's keeper:
:class:`~model_debugger.trainers.torch.TorchTrainer` or
:class:`~model_debugger.trainers.keras.KerasTrainer`. Importing this package imports neither
framework.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Trainer(Protocol):
    """What a probe may do with the kept objects of a run.

    Attributes
    ----------
    framework : str
        ``"torch"`` or ``"keras"``.
    model : object
        The user's model (only copied).
    initial_state : object
        Its weights from before the first step.
    opt_cls : type
        The user's optimizer class.
    hyper : dict
        Its hyperparameters (``"lr"`` among them when known).
    loss_fn : callable
        The loss, named like the PyTorch functional it corresponds to (``cross_entropy``, ...).
    loss_kwargs : dict
        Options the user passed to the loss (``ignore_index``, ...).
    inputs, targets : tuple of arrays, array
        The kept training sample (the model's positional inputs, the targets), rows aligned.
    val_inputs, val_targets : tuple of arrays, array, or None
        The kept validation sample.
    """

    framework: str
    model: Any
    initial_state: Any
    opt_cls: Any
    hyper: dict
    loss_fn: Any
    loss_kwargs: dict
    inputs: Any
    targets: Any
    val_inputs: Any
    val_targets: Any

    @property
    def lr(self) -> float:
        """The user's learning rate."""

    @property
    def adam(self) -> type:
        """The framework's Adam class (probes train with a fixed, well-behaved optimizer)."""

    @property
    def n(self) -> int:
        """Rows in the kept training sample."""

    def fresh_model(self) -> Any:
        """A copy of the model with its initial weights, ready to train."""

    def unfreeze(self, model: Any) -> Any:
        """Make every parameter of ``model`` (a fresh copy, not yet trained) train; returns it."""

    def optimizer(self, model: Any = None, lr: float | None = None, cls: Any = None) -> Any:
        """A new optimizer of the user's class and settings (``lr`` / ``cls`` override)."""

    def subset(self, idx: Any) -> tuple:
        """``(inputs, target)`` rows ``idx`` of the training sample."""

    def randperm(self, n: int, seed: int) -> Any:
        """A seeded permutation of ``range(n)`` (indices for :meth:`subset`)."""

    def fit(self, model: Any, inputs: tuple, target: Any, steps: int, lr: float | None = None,
            batch_size: int = 64, seed: int = 0, opt_cls: Any = None,
            stop_below: float | None = None, check: Any = None, every: int = 10,
            shuffle: bool = True) -> list[float]:
        """Train ``model`` in place for ``steps`` minibatch steps; the loss per step.

        Stops early when the loss is non-finite or below ``stop_below``; ``check(model)`` is
        called every ``every`` steps and after the last one. Batches are drawn at random, or
        with ``shuffle=False`` are consecutive rows in their given order, cycled.
        """

    def predict(self, model: Any, inputs: tuple) -> Any:
        """``model``'s outputs on the given rows in inference mode, as a NumPy array."""

    def evaluate(self, model: Any, inputs: tuple, target: Any) -> float:
        """Mean loss of ``model`` on the given rows, in inference mode."""

    def steps_within(self, steps: int, batch_size: int = 64, floor: int = 30,
                     work: float = 2e7, seconds: float | None = None) -> int:
        """How many of ``steps`` training steps a probe affords on this model.

        At least ``floor``; timed against ``seconds`` only for large models.
        """

    def sweep(self, lr_min: float, lr_max: float, steps: int) -> tuple:
        """A geometric learning-rate sweep from the initial weights.

        ``(rates, smoothed losses)`` as NumPy arrays, stopped where the loss diverges.
        """

    def throughput(self, batch_size: int, steps: int = 20, model=None) -> float:
        """Training rows per second of a fresh copy (or of ``model``) at ``batch_size``."""

    def param_bytes(self) -> int:
        """Bytes of the model's parameters."""

    def per_sample_bytes(self, inputs: tuple) -> float:
        """Bytes of inputs plus every layer output per sample (what backward keeps)."""


def trainer_for(keeper) -> Trainer | None:
    """The trainer of a capture's keeper, or None when its objects cannot train a copy.

    Parameters
    ----------
    keeper : Keeper, KerasKeeper or None
        What the capture kept (:mod:`model_debugger.capture.keeper`,
        :mod:`model_debugger.capture.keras_keeper`).

    Returns
    -------
    Trainer or None
        None without a model, an optimizer, a loss and sample batches, or when the framework
        cannot copy the model (record-only probes still run).
    """
    if keeper is None or keeper.model is None or not (
            keeper.optimizer and keeper.loss and keeper.train_batches):
        return None
    if getattr(keeper, "framework", "torch") == "keras":
        from .keras import from_keeper
    else:
        from .torch import from_keeper
    return from_keeper(keeper)


__all__ = ["Trainer", "trainer_for"]
