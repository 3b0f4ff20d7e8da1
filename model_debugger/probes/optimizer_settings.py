"""``optimizer_settings``: an optimizer setting that keeps the updates from working.

The settings besides the rate that can stall or destabilise training: a weight decay that pulls
the weights to zero faster than the gradient moves them, a momentum (or Adam's first beta) so
close to 1 that the update follows gradients from long ago, and a gradient clip so tight that
every update is shrunk a hundredfold. Measured on the captured optimizer (and, for a clip in a
PyTorch loop, on the record: the bound against the gradient norms it cut), then tested by
experiment, one setting at a time: two fresh copies trained on the same rows, one as set up and
one with the setting at its usual value; confirmed when that copy reaches a clearly lower
held-out loss. A momentum that destabilises builds up over many steps (Adam's betas swapped:
the first moment remembers gradients the second has forgotten, and the steps grow once the
gradients shrink), so on a run that blew up the copies train at the run's batch size for as many
steps as the run took to blow up (and half again), on two orders of the rows: confirmed when
the copy as set up blows up on both and the one at the usual value on neither (else the
held-out comparison decides, as for any setting). Located at the optimizer (or the clip call).
"""

from __future__ import annotations

import numpy as np

from ..records import Intervention
from ..signals import blowup_step
from ..thresholds import DIVERGE_RATIO
from ._heldout import BETTER, heldout_loss
from .base import Probe, ProbeContext, blown_up, register, setting_location

DECAY = 0.1         # a decay added to the gradient (SGD, Adam) at or above this is suspect
DECAY_PER_STEP = 1e-3  # and any decay shrinking the weights by rate x decay this much per step
MOMENTUM = 0.99     # momentum / beta1 at or above this is suspect
CLIP_SHARE = 0.01   # a clip that leaves under 1% of the median gradient norm is suspect
CLIP_ABS = 1e-3     # without recorded norms: a bound this small is suspect whatever they were
MAX_REPLAY = 2000   # steps a copy replays at most to reach the run's blow-up
USUAL = {"weight_decay": 0.0, "momentum": 0.9, "beta1": 0.9, "clip": None}
_WHAT = {"weight_decay": "a weight decay of {v:.3g} (pulling the weights towards zero)",
         "momentum": "a momentum of {v:.4g} (each update follows gradients from long ago)",
         "beta1": "a first-moment beta of {v:.4g} (each update follows gradients from long ago)",
         "clip": "a gradient clip at {v:.3g}, {share:.2g}x the median gradient norm"}


@register
class OptimizerSettings(Probe):
    """A suspect weight decay, momentum or clip, and a copy without it learns clearly better."""

    id = "optimizer_settings"
    cost = 2
    categories = ("loss_not_decreasing", "gradient_instability", "convergence_to_wrong_solution")
    needs_live = True
    fix = ("Set {setting} back to a usual value ({usual}); tune it only once training works.")

    def suggestion(self, finding) -> str:
        """The fix for the setting the finding names."""
        setting = finding.evidence.get("setting", "the setting")
        usual = USUAL.get(setting, "its default")
        return self.fix.format(setting=setting, usual="no clipping" if usual is None else usual)

    def intervention(self, finding):
        """The setting at its usual value in the re-run (the clip removed)."""
        setting = finding.evidence.get("setting")
        if setting not in USUAL:
            return None
        if setting == "clip":
            return Intervention("clip_off")
        return Intervention("optimizer_setting", {"setting": setting, "value": USUAL[setting]})

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer over the kept sample."""
        return super().applies(ctx) and ctx.trainer is not None and ctx.trainer.n >= 16

    def run(self, ctx: ProbeContext):
        """One finding per suspect setting, each tested by its own experiment."""
        tr = ctx.trainer
        settings = dict(tr.settings())
        clip_at = None
        if tr.framework == "torch":  # the loop clips, not the optimizer: read the record
            clip = ctx.run.first("clip")
            if clip is not None:
                settings["clip"] = float(clip["max_norm"])
                clip_at = clip.get("location")
                tr = tr.with_settings(clip=settings["clip"])  # copies clip as the loop did
        decoupled = tr.framework == "keras" or tr.opt_cls.__name__ == "AdamW" or \
            bool(getattr(tr, "hyper", {}).get("decoupled_weight_decay"))
        suspects = _suspects(settings, tr.lr, ctx.run.series("gn"), decoupled)
        unstable = bool(blown_up(ctx)) or _diverged(ctx)
        if unstable:  # a decay or a clip shrinks the updates: neither makes a loss grow
            suspects.pop("weight_decay", None)
            suspects.pop("clip", None)
        if not suspects:
            return []
        out, replayed = [], {}
        onset = blowup_step(ctx.signals) if unstable else None
        if onset is not None:
            for setting in [k for k in ("momentum", "beta1") if k in suspects]:
                found = self._replay(ctx, tr, setting, suspects[setting], settings[setting],
                                     onset)
                if found is not None and found.confirmed:
                    out.append(found)
                    suspects.pop(setting)
                elif found is not None:  # not settled by the replay: the held-out comparison
                    replayed[setting] = {k: found.evidence[k] for k in (  # decides, with it
                        "onset_step", "replay_steps", "peak_as_set", "peak_usual")}
        if not suspects:
            return out
        as_set = heldout_loss(tr, ctx)
        for setting, why in suspects.items():
            if ctx.time_left() <= 0:
                break
            changed = heldout_loss(tr.with_settings(**{setting: USUAL[setting]}), ctx)
            confirmed = changed < BETTER * as_set
            usual = "no clip" if USUAL[setting] is None else f"{setting} {USUAL[setting]}"
            out.append(self.finding(
                "hyperparameter", confirmed,
                f"The optimizer runs with {why}. Two fresh copies trained on the same rows reach "
                f"a held-out loss of {changed:.4g} with {usual} and {as_set:.4g} as set up"
                + (f": the {setting} setting holds the training back." if confirmed else
                   ": no clearly better, so it is not what holds the training back."),
                setting_location((clip_at if setting == "clip" and clip_at else None)
                                 or ctx.ref("optimizer") or ctx.ref("step"), setting),
                undone=confirmed, strength=0.8 if confirmed else 0.15, setting=setting,
                value=settings[setting], usual=USUAL[setting], heldout_as_set=as_set,
                heldout_changed=changed,
                **({"replay": replayed[setting]} if setting in replayed else {})))
        return out

    def _replay(self, ctx: ProbeContext, tr, setting: str, why: str, value: float,
                onset: int):
        """Copies trained as long as the run took to blow up, as set up and with ``setting`` usual.

        None when the budget cannot afford that many steps (the held-out comparison decides).
        """
        import time

        batch = int(ctx.train_batches[0][1].shape[0]) if ctx.train_batches else 32
        steps = min(MAX_REPLAY, int(onset * 1.5) + 20)
        inputs, target = tr.subset(slice(None))
        t0 = time.perf_counter()  # a copy's set-up (a trace) and steps timed: the four
        model = tr.fresh_model()  # replays must fit in half the time left
        tr.fit(model, inputs, target, 2, batch_size=batch)
        t1 = time.perf_counter()
        tr.fit(model, inputs, target, 5, batch_size=batch)
        per_step = (time.perf_counter() - t1) / 5
        if 4 * ((t1 - t0) + steps * per_step) > ctx.time_left() / 2:
            return None
        usual = tr.with_settings(**{setting: USUAL[setting]})
        runs = {"as_set": [], "usual": []}
        for seed in (0, 1):
            for name, trainer in (("as_set", tr), ("usual", usual)):
                if ctx.time_left() <= 0:
                    return None
                losses = trainer.fit(trainer.fresh_model(), inputs, target, steps,
                                     batch_size=batch, seed=seed)
                runs[name].append(_peak(losses))
        confirmed = all(r >= DIVERGE_RATIO for r in runs["as_set"]) and \
            all(r < DIVERGE_RATIO for r in runs["usual"])
        peaks = ", ".join(_ratio(r) for r in runs["as_set"])
        usual_peaks = ", ".join(_ratio(r) for r in runs["usual"])
        return self.finding(
            "hyperparameter", confirmed,
            f"The optimizer runs with {why}. The run blew up at step {onset}; fresh copies "
            f"trained {steps} steps of {batch} rows on two orders of the kept rows rose to "
            f"{peaks} as set up and {usual_peaks} with {setting} {USUAL[setting]}"
            + (f": the {setting} setting makes the training unstable." if confirmed else
               ": that does not settle it."),
            setting_location(ctx.ref("optimizer") or ctx.ref("step"), setting),
            undone=confirmed, strength=0.8 if confirmed else 0.15, setting=setting, value=value,
            usual=USUAL[setting], onset_step=onset, replay_steps=steps,
            peak_as_set=runs["as_set"], peak_usual=runs["usual"])


def _peak(losses: list[float]) -> float:
    """A copy's highest loss after a 10% warm-up over its first losses (inf: non-finite)."""
    if not losses or not all(np.isfinite(losses)):
        return float("inf")
    arr = np.asarray(losses, dtype=float)
    start = float(np.median(arr[:5]))
    if start <= 0:  # (a loss that can go negative, a likelihood: no ratio to its start)
        return 0.0
    return float(np.max(arr[len(arr) // 10:]) / start)


def _ratio(r: float) -> str:
    return "non-finite" if not np.isfinite(r) else f"{r:.3g}x its start"


def _suspects(settings: dict, lr: float, gn: np.ndarray, decoupled: bool) -> dict[str, str]:
    """The settings outside their usual range, each with the words that describe it.

    A decoupled weight decay (AdamW, Keras) shrinks the weights by rate x decay per step, so
    only that product is judged (AdamW's 0.1 at 1e-3 is the usual choice); a decay added to the
    gradient (SGD, Adam) is judged by its size too.
    """
    out = {}
    wd = settings.get("weight_decay")
    if isinstance(wd, (int, float)) and wd > 0 and (
            lr * wd >= DECAY_PER_STEP or not decoupled and wd >= DECAY):
        out["weight_decay"] = _WHAT["weight_decay"].format(v=wd)
    for key in ("momentum", "beta1"):
        v = settings.get(key)
        if isinstance(v, (int, float)) and v >= MOMENTUM:
            out[key] = _WHAT[key].format(v=v)
    clip = settings.get("clip")
    norms = gn[np.isfinite(gn)] if gn.size else gn
    if isinstance(clip, (int, float)) and clip > 0:
        if norms.size:
            share = clip / max(float(np.median(norms)), 1e-12)
            if share < CLIP_SHARE:
                out["clip"] = _WHAT["clip"].format(v=clip, share=share)
        elif clip < CLIP_ABS:
            out["clip"] = f"a gradient clip at {clip:.3g}"
    return out


def _diverged(ctx: ProbeContext) -> bool:
    """Whether the run went non-finite or its loss diverged (ended ``DIVERGE_RATIO`` x higher)."""
    sig = ctx.signals or {}
    final, initial = sig.get("loss_final"), sig.get("loss_initial")
    return "first_nonfinite_step" in sig or (
        isinstance(final, (int, float)) and isinstance(initial, (int, float)) and initial > 0 and final >= DIVERGE_RATIO * initial)
