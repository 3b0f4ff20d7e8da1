"""Probe ``feature_scaling``: whether the input features are on wildly different scales.

Gradient descent on unscaled inputs is ill-conditioned: the weights of a feature measured in the
thousands get gradients orders of magnitude larger than those of a feature measured in units, so
one learning rate is too large for the first and too small for the second. Measured on the
training inputs, per feature (constant features are ignored):

- spread disparity: ``max std / min std >= 100``, and the ranges (max - min) differ by as much,
  so a sparse feature (mostly zeros, same range as the others) does not count;
- offset: ``|mean| >= 10 * std`` and ``|mean| >= 10`` (e.g. a year or a timestamp);
- magnitude: ``max |x| > 1e3``;
- every feature on one large scale (median std >= 20: raw pixels, values in the hundreds): no
  threshold confirms it, an experiment does, a fresh copy on standardised inputs against one on
  the inputs as they are.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..records import Finding
from . import _numpy_stats as st
from ._layers import keras_layers, token_ids
from .base import Probe, ProbeContext, register

RATIO = 100.0       # spread disparity between features
OFFSET = 10.0       # |mean| / std
OFFSET_ABS = 10.0   # and |mean| itself
MAGNITUDE = 1e3     # max |x|
SPREAD = 20.0       # every feature's spread this large: tested by a standardised copy
DECADE = 1.0        # a feature is named when its std is this many decades from the typical one
TOP = 10


@register
class FeatureScaling(Probe):
    """Find input features whose scale is far from the others'."""

    id = "feature_scaling"
    about_scale = True
    cost = 2
    data_role = "inputs"
    categories = ("gradient_instability", "loss_not_decreasing")
    needs_live = False
    fix = ("Standardise the input features with statistics of the training split ((x - mean) / "
           "std per feature) before building the dataset.")

    def intervention(self, finding: Finding):
        """Standardise the model's inputs per feature in the re-run."""
        from ..records import Intervention

        return Intervention("standardize_inputs")

    def applies(self, ctx: ProbeContext) -> bool:
        """When training input arrays are available and are features, not token ids."""
        return super().applies(ctx) and ctx.train_xy is not None and not token_ids(ctx)

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed finding, naming the worst features, when a criterion above holds.

        A Keras model that normalises its first input itself (a ``Normalization`` layer on it)
        is judged on what that layer gives the next one (:func:`_normalised_inside`).
        """
        inside = _normalised_inside(ctx)
        if inside is not None:
            return self._inside(ctx, *inside)
        x = st.as_matrix(ctx.train_xy[0])
        x = np.where(np.isfinite(x), x, np.nan)
        if len(x) < 2 or np.isnan(x).all():
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN columns
            std, mean = np.nanstd(x, axis=0), np.nanmean(x, axis=0)
            span, peak = np.nanmax(x, axis=0) - np.nanmin(x, axis=0), np.nanmax(np.abs(x), axis=0)
        live = np.flatnonzero(std > 0)
        if not len(live):
            return []
        names = st.feature_names(ctx, x.shape[1])
        std_ratio = float(std[live].max() / std[live].min())
        span_ratio = float(span[live].max() / span[live].min())
        disparity = std_ratio >= RATIO and span_ratio >= RATIO
        offset = live[(np.abs(mean[live]) >= OFFSET * std[live])
                      & (np.abs(mean[live]) >= OFFSET_ABS)]
        large = np.flatnonzero(peak > MAGNITUDE)
        if not disparity and not len(offset) and not len(large):
            return self._uniformly_large(ctx, std[live], x.shape[1])

        log_std = np.log10(np.where(std > 0, std, 1.0))
        decades = np.abs(log_std - np.median(log_std[live]))
        decades[std == 0] = 0.0
        named = set(offset) | set(large)
        if disparity:
            far = set(live[decades[live] >= DECADE])
            named |= far or {live[np.argmax(std[live])], live[np.argmin(std[live])]}
        badness = np.maximum(decades, np.log10(np.maximum(peak, 1.0)) / 3)
        worst = sorted(named, key=lambda j: -badness[j])[:TOP]
        offending = [{"feature": names[j], "std": float(std[j]), "mean": float(mean[j]),
                      "max_abs": float(peak[j])} for j in worst]
        reasons = []
        if disparity:
            reasons.append(f"per-feature standard deviations differ {std_ratio:.3g}-fold "
                           f"(ranges {span_ratio:.3g}-fold)")
        if len(offset):
            reasons.append(f"{len(offset)} feature(s) sit far from zero relative to their spread "
                           f"(|mean| >= {OFFSET:g} std)")
        if len(large):
            reasons.append(f"{len(large)} feature(s) reach |x| > {MAGNITUDE:g}")
        cols = ", ".join(f"{o['feature']} (std {o['std']:.3g}, mean {o['mean']:.3g})"
                         for o in offending)
        text = ("Input features are on very different scales: " + "; ".join(reasons)
                + f". Offending columns: {cols}. Gradients for large-scale features dwarf the "
                "others, so no single learning rate suits all weights (unstable or stalled "
                "loss). Standardise the inputs (subtract the mean, divide by the std), unless "
                "the model already normalises them.")
        strength = float(np.clip(max(np.log10(std_ratio) / 4 if disparity else 0.0,
                                     np.log10(max(peak.max(), 1.0)) / 6 if len(large) else 0.0,
                                     0.5 if len(offset) else 0.0), 0.0, 1.0))
        return [self.finding("data", True, text, st.data_location(ctx), strength=strength,
                             std_ratio=std_ratio, range_ratio=span_ratio,
                             offset_features=[names[j] for j in offset[:TOP]],
                             large_features=[names[j] for j in large[:TOP]],
                             offending=offending, features=int(x.shape[1]),
                             constant_features=int(x.shape[1] - len(live)))]

    def _inside(self, ctx: ProbeContext, layer, out: np.ndarray) -> list:
        """The model's own ``Normalization`` leaves its features on different scales.

        Never adapted (mean 0, variance 1: the raw values pass), adapted over every feature at
        once (``axis=None``: one mean and spread for all), or adapted on other data. Confirmed
        when a fresh copy fed inputs the layer turns into standardised features trains clearly
        better than one on the inputs as they are; located where the layer was made.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            std, mean = np.nanstd(out, axis=0), np.nanmean(out, axis=0)
            span = np.nanmax(out, axis=0) - np.nanmin(out, axis=0)
        live = std > 0
        if live.sum() < 2:
            return []
        ratio = float(std[live].max() / std[live].min())
        spread = ratio >= RATIO and float(span[live].max() / span[live].min()) >= RATIO
        far = float(np.abs(mean[live]).max())
        if not spread and far < OFFSET_ABS:
            return []  # the layer standardises its input: nothing to say about the raw scales
        got = standardised_inputs_better(ctx, through=layer)
        if got is None:
            return []
        as_is, standardised, confirmed = got
        where = _layer_line(ctx, layer) or st.data_location(ctx)
        return [self.finding(
            "data", confirmed,
            f"The model's {type(layer).__name__} layer {layer.name!r} does not standardise its "
            f"input per feature: after it the features' standard deviations still differ "
            f"{ratio:.3g}-fold (largest |mean| {far:.3g})"
            + (" (it computes one mean and spread over every feature: axis=None)"
               if getattr(layer, "axis", ()) in ((), None) else "")
            + f". Two fresh copies trained on the same rows reach a held-out loss of "
            f"{standardised:.4g} when the layer's output is standardised and {as_is:.4g} as "
            "built" + (": the layer's statistics hold the training back. Adapt it per feature "
                       "(axis=-1, on the training inputs)." if confirmed else
                       ": no clearly better, so the scales are not what holds it back."),
            where, undone=confirmed, strength=0.85 if confirmed else 0.15,
            std_ratio_after_layer=ratio, heldout_as_is=as_is,
            heldout_standardised=standardised, layer=layer.name)]

    def _uniformly_large(self, ctx: ProbeContext, std: np.ndarray, d: int) -> list:
        """Every feature on one large scale (raw pixels 0-255, values in the hundreds).

        No disparity to measure, so an experiment decides: a fresh copy on standardised inputs
        against one on the inputs as they are (:func:`standardised_inputs_better`).
        """
        typical = float(np.median(std))
        if typical < SPREAD:
            return []
        got = standardised_inputs_better(ctx)
        if got is None:
            return []
        as_is, standardised, confirmed = got
        return [self.finding(
            "data", confirmed,
            f"Every input feature is on a large scale (median standard deviation {typical:.3g} "
            f"over {len(std)} features). Two fresh copies trained on the same rows reach a "
            f"held-out loss of {standardised:.4g} on standardised inputs and {as_is:.4g} on the "
            "inputs as they are"
            + (": the scale of the inputs holds the training back. Standardise them (or divide "
               "raw pixels by 255)." if confirmed else
               ": no clearly better, so their scale is not what holds it back."),
            st.data_location(ctx), undone=confirmed, strength=0.8 if confirmed else 0.15,
            typical_std=typical, heldout_as_is=as_is, heldout_standardised=standardised,
            features=int(d))]


def standardised_inputs_better(ctx: ProbeContext, through=None
                                ) -> tuple[float, float, bool] | None:
    """``(held-out loss as is, on standardised inputs, whether clearly better)``, or None.

    Two fresh copies on the same rows of the kept sample; the first input is standardised per
    feature with the training rows' statistics (held-out rows with the same). ``through``: a
    Keras ``Normalization`` layer the model applies to that input itself; the copy is fed
    ``mean + sqrt(variance) * z`` (its own statistics), so that the layer gives it the
    standardised ``z``. None without a trainer or a floating-point first input.
    """
    import math

    from ._heldout import BETTER, as_is, heldout_variants

    tr = ctx.trainer
    if tr is None or not ctx.live or tr.n < 40:
        return None
    first = tr.inputs[0]
    torch_like = hasattr(first, "is_floating_point")  # a tensor, else a NumPy array
    if not hasattr(first, "ndim") or first.ndim < 2 or not (
            first.is_floating_point() if torch_like else np.issubdtype(first.dtype, np.floating)):
        return None
    keep = {"keepdim" if torch_like else "keepdims": True}

    def standardised(inputs, target, cut):
        x = inputs[0]
        mean, std = x[:cut].mean(0, **keep), x[:cut].std(0, **keep)
        std = std + (std == 0) * 1.0  # constant features are left as they are
        z = (x - mean) / std
        if through is not None:  # what the layer maps to z
            m, v = _layer_stats(through)
            z = (m + np.sqrt(v) * z).astype(x.dtype)
        return (z, *inputs[1:]), target

    (raw, _), (changed, _) = heldout_variants(ctx, [as_is, standardised], seed=3)[0]
    return raw, changed, math.isfinite(changed) and changed < BETTER * raw


def _layer_stats(layer) -> tuple[np.ndarray, np.ndarray]:
    """A Keras ``Normalization``'s mean and variance as NumPy arrays (broadcastable)."""
    return (np.asarray(layer.mean, dtype=np.float64).reshape(-1) if np.ndim(layer.mean) else
            np.float64(layer.mean),
            np.asarray(layer.variance, dtype=np.float64).reshape(-1) if np.ndim(layer.variance)
            else np.float64(layer.variance))


def _normalised_inside(ctx: ProbeContext) -> tuple | None:
    """``(layer, its output on the kept rows)`` when a Keras model normalises its first input.

    The ``Normalization`` layer (not inverted) applied directly to the model's first input,
    in a functional or Sequential model; None otherwise (the raw inputs are then judged).
    """
    model = ctx.model
    if ctx.framework != "keras" or model is None or ctx.trainer is None or \
            getattr(ctx.trainer, "inputs", None) is None:
        return None
    try:
        import keras

        first = model.inputs[0]
        layers = [layer for layer in keras_layers(model)
                  if isinstance(layer, keras.layers.Normalization) and not layer.invert
                  and any(node.input_tensors and node.input_tensors[0] is first
                          for node in getattr(layer, "_inbound_nodes", []))]
        if isinstance(model, keras.Sequential) and not layers:
            head = model.layers[0] if model.layers else None
            layers = [head] if isinstance(head, keras.layers.Normalization) and \
                not head.invert else []
        if len(layers) != 1 or getattr(layers[0], "mean", None) is None:
            return None
        x = np.asarray(ctx.trainer.inputs[0][:2048], dtype=np.float64)
        if x.ndim != 2:
            return None  # pixels, time steps: not one feature per column
        m, v = _layer_stats(layers[0])
        out = (x.reshape(len(x), -1) - m) / np.sqrt(np.maximum(v, 1e-12))
    except Exception:  # noqa: BLE001 - a layer without statistics: the raw inputs are judged
        return None
    return layers[0], out


def _layer_line(ctx: ProbeContext, layer) -> dict | None:
    """Where the user's code made ``layer`` (its class called once in the model's file)."""
    import re

    from ._heldout import source_line

    return source_line(ctx, re.compile(rf"\b{type(layer).__name__}\s*\("), near=ctx.ref("model"))
