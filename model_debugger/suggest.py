"""Suggested fixes per finding, and the signal each category is judged by before and after.

Suggestions are text shown with the plan; nothing here changes code. The defining signal of a
category is what Verify compares across seeds; :func:`expected_effect` states the target.
"""

from __future__ import annotations

from .defining import DEFINING, defining_signal, expected_effect
from .records import Finding

__all__ = ["DEFINING", "defining_signal", "expected_effect", "suggest"]

_TEMPLATES = {
    "missing_zero_grad": "Call optimizer.zero_grad() once per step, before loss.backward(), so "
                         "gradients do not accumulate across steps.",
    "optimizer_recreated": "Build the optimizer once, before the training loop, and reuse it "
                           "for every step (its state, Adam's moments or SGD's momentum, "
                           "must carry over from step to step).",
    "loss_output_mismatch": "Remove the Softmax/LogSoftmax (or sigmoid) before a loss that "
                            "expects raw logits (CrossEntropyLoss, BCEWithLogitsLoss), or switch "
                            "to the loss that matches the output (NLLLoss after LogSoftmax).",
    "feature_scaling": "Standardise the input features with statistics of the training split "
                       "((x - mean) / std per feature) before building the dataset.",
    "graph_retention": "Store losses with .item() (or .detach()) so tensors that carry autograd "
                       "history are not kept across steps.",
    "dataloader_throughput": "Move the expensive work out of the per-sample path (vectorised "
                             "collate, precomputed tensors) or load in parallel with "
                             "DataLoader(num_workers=N, persistent_workers=True).",
    "class_imbalance": "Weight the loss by inverse class frequency (CrossEntropyLoss(weight=...)) "
                       "or resample; for a binary score, choose the decision threshold on "
                       "validation data.",
    "label_alignment": "Keep inputs and labels aligned: apply the same index/permutation to both "
                       "(sort or shuffle them together).",
    "detached_output": "Remove the .detach()/.data/no_grad on the path from the model's output to "
                       "the loss, so gradients reach the weights.",
    "eval_mode_not_reset": "Call model.train() again after evaluation, before the next training "
                           "steps.",
    "leakage": "Remove the leaking feature or the duplicated rows so validation samples are not "
               "seen in training.",
    "distribution_shift": "Build the validation split from the same distribution as training "
                          "(shuffle before splitting, same preprocessing).",
    "data_volume": "Regularise the optimisation (weight decay, early stopping on the validation "
                   "loss) or train on more data; a smaller model is an architecture change and "
                   "needs an explicit override for a data cause.",
    "dead_units": "Use an initialisation and activation that keep units alive (He init, "
                  "LeakyReLU), or lower the learning rate.",
    "constant_baseline": "Raise the learning rate or train longer until the model beats the "
                         "constant predictor.",
    "seed_variance": "Lower the learning rate or enlarge the batch, and judge changes across "
                     "seeds.",
    "hardware": "Escalate: rerun on another device, check drivers and memory; do not patch the "
                "training code.",
}


def suggest(finding: Finding, session=None) -> str:
    """The suggested fix for a finding (shown with the plan, never applied without approval)."""
    ev = finding.evidence or {}
    check = finding.check
    if check == "lr_range" and ev.get("safe_lr"):
        return (f"Set the learning rate to about {ev['safe_lr']:.3g} (now {ev.get('lr', '?')}), "
                "the rate the sweep from the initial weights found safe.")
    if check == "batch_memory" and ev.get("largest_batch_that_fits"):
        return (f"Lower the batch size to at most {ev['largest_batch_that_fits']} (or use "
                "gradient accumulation to keep the effective batch).")
    if check == "gradient_flow" and ev.get("vanishing_layers"):
        return ("Use an activation and initialisation that keep gradients alive in "
                f"{', '.join(map(str, ev['vanishing_layers'][:3]))} (ReLU/GELU with He init, "
                "residual connections or normalisation layers).")
    if check == "gradient_flow" and finding.root_cause == "hyperparameter":
        return ("Lower the learning rate (see lr_range's safe rate) so the values that overflow "
                "stop growing; keep the model as it is.")
    if check == "gradient_flow":
        return ("Guard the operation that produces the first non-finite value (e.g. clamp before "
                "log, add an epsilon), or lower the learning rate if the values grow first.")
    if check == "dataloader_throughput" and ev.get("num_workers") == 0:
        return ("Load batches in parallel: DataLoader(num_workers=N) with N up to the CPU count, "
                "or vectorise the per-sample work.")
    return _TEMPLATES.get(check, "Change the code at the finding's location so the measured "
                                 "cause no longer holds; keep it to one change.")
