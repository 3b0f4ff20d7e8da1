"""The capture's watch over a hand-written validation score (:mod:`.torch_eval_labels`).

It lives on torch's global function-mode stack between an evaluation forward and the next
forward. Whatever the user's code does with modes of its own (a ``torch.device`` context, a
``TorchFunctionMode`` around the evaluation or entered after it, nested captures), no mode of
the capture's may stay behind and no mode of the user's may be lost. What it keeps must be
what the training loss was given: a binary task's ``(B, 1)`` float targets as they are; a
comparison of two thresholded values (a regression's sign agreement) is no target.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, _len_torch_function_stack

import model_debugger


class Passing(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def data(binary: bool = False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    y = (x[:, 0] > 0).float().unsqueeze(1) if binary else (x[:, 0] > 0).long() + \
        (x[:, 1] > 0).long()
    return x[:300], y[:300], x[300:], y[300:]


def train(evaluate, epochs: int = 2, binary: bool = False):
    torch.manual_seed(0)
    x, y, xv, yv = data(binary)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1 if binary else 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss_fn = F.binary_cross_entropy_with_logits if binary else F.cross_entropy
    for _ in range(epochs):
        for i in range(0, 300, 50):
            opt.zero_grad()
            loss_fn(net(x[i:i + 50]), y[i:i + 50]).backward()
            opt.step()
        evaluate(net, xv, yv)
    return net


def plain(net, xv, yv):
    with torch.no_grad():
        return (net(xv).argmax(1) == yv).float().mean()


def inside_a_user_mode(net, xv, yv):
    with Passing(), torch.no_grad():
        return (net(xv).argmax(1) == yv).float().mean()


def user_mode_after_the_forward(net, xv, yv):
    with torch.no_grad():
        out = net(xv)
        with Passing():
            net(xv[:5])  # a forward inside the user's mode ends the watch
        return (out.argmax(1) == yv).float().mean()


@pytest.mark.parametrize("evaluate", [plain, inside_a_user_mode, user_mode_after_the_forward])
def test_no_mode_is_left_behind_or_lost(evaluate):
    assert _len_torch_function_stack() == 0
    with model_debugger.capture() as rec:
        train(evaluate)
    assert _len_torch_function_stack() == 0
    if evaluate is plain:
        assert rec.keeper.val_source == "compare" and rec.keeper.val_batches


def test_a_device_context_inside_the_capture_stays_the_users():
    """``with torch.device(...)`` entered after the capture began, around the training: its exit
    must remove the context, not the watch above it."""
    with model_debugger.capture() as rec:
        with torch.device("cpu"):
            assert _len_torch_function_stack() == 1
            train(plain)
            assert _len_torch_function_stack() == 1  # the user's context, still on top
        assert _len_torch_function_stack() == 0
    assert _len_torch_function_stack() == 0
    assert not rec.keeper.val_batches  # (under another mode the capture does not watch)


def test_nested_captures_leave_no_watch():
    outer = model_debugger.capture()
    inner = model_debugger.capture()
    outer.__enter__()
    inner.__enter__()
    try:
        train(plain)
    finally:
        outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
    assert _len_torch_function_stack() == 0


def test_binary_targets_keep_their_shape_and_a_sign_agreement_is_no_target():
    def thresholded(net, xv, yv):
        with torch.no_grad():
            return ((torch.sigmoid(net(xv)) > 0.5).float() == yv).float().mean()

    with model_debugger.capture() as rec:
        train(thresholded, binary=True)
    assert rec.keeper.val_batches and all(t.shape == (100, 1) and t.is_floating_point()
                                          for _, t in rec.keeper.val_batches)

    def sign_agreement(net, xv, yv):
        with torch.no_grad():
            pred = net(xv)
            return ((pred[:, 0] > 0) == (yv[:, 0] > 0)).float().mean()

    with model_debugger.capture() as rec:
        train(sign_agreement, binary=True)
    assert not rec.keeper.val_batches


def test_a_score_of_the_training_rows_is_not_validation():
    """``(model(X).argmax(1) == y)`` over the training set under ``no_grad`` (a training
    score): not kept as validation, so no leak of validation into training is reported."""
    def on_training_rows(net, xv, yv):
        x, y = data()[:2]
        with torch.no_grad():
            return (net(x).argmax(1) == y).float().mean()

    with model_debugger.capture() as rec:
        train(on_training_rows)
    assert not rec.keeper.val_batches and rec.keeper.val_source is None
