"""``data_order``'s measurement: the share of the targets' variance between batches."""

from __future__ import annotations

import numpy as np

from model_debugger.probes.data_order import between_share, target_matrix


def test_random_batches_hold_little_variance_between_them_and_sorted_ones_nearly_all():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(1024, 1))
    sizes = [32] * 32
    shuffled = between_share(y, sizes)
    assert shuffled < 0.1  # about (32 - 1) / (1024 - 1) = 0.03
    assert between_share(np.sort(y, axis=0), sizes) > 0.95


def test_classes_one_after_another_are_an_order_and_constant_targets_are_not():
    labels = np.repeat(np.arange(4), 100)
    y = target_matrix(labels, "cross_entropy")
    assert y.shape == (400, 4)
    assert between_share(y, [20] * 20) > 0.9
    mixed = target_matrix(np.tile(np.arange(4), 100), "cross_entropy")
    assert between_share(mixed, [20] * 20) == 0.0  # every batch holds each class 5 times
    assert between_share(np.ones((400, 1)), [20] * 20) == 0.0


def test_sequence_targets_and_wide_outputs_are_not_judged():
    tokens = np.random.default_rng(1).integers(0, 500, size=(64, 12))
    assert target_matrix(tokens, "cross_entropy") is None
    assert target_matrix(np.zeros((64, 100)), "mse_loss") is None
    assert target_matrix(np.zeros((64, 3)), "mse_loss").shape == (64, 3)
