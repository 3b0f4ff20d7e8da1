"""``initialization``: initial weights far from any working initialisation.

Measured on the weights captured before the first step: each layer's are compared with the same
layer re-initialised the framework's default way (a spread 10x smaller or 5x larger, all zeros,
a bias of -10 in front of a ReLU). Then tested by experiment: two fresh copies trained on the
same rows, one from the user's initial weights and one re-initialised by default; the finding is
confirmed when the default-initialised copy reaches a clearly lower held-out loss. The finding
is located at the line that set the weights (an ``init``/``fill_``/``mul_`` call, an
``*_initializer=`` argument) near where the model was built.
"""

from __future__ import annotations

import re

from ..records import Intervention
from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register, setting_location

_INIT = re.compile(r"\binit\.\w+_?\(|\.(?:fill_|zero_|normal_|uniform_|mul_|div_|copy_|"
                   r"constant_)\(|_initializer\s*=|\binitializers\.|\.set_weights\(")
_WORDS = {"small": "{ratio:.2g}x the default spread", "large": "{ratio:.3g}x the default spread",
          "offset": "a mean offset of {offset:.3g} from the default"}


@register
class Initialization(SettingExperiment):
    """Initial weights far from the default init, and a default-initialised copy learns better."""

    id = "initialization"
    cost = 2
    categories = ("loss_not_decreasing", "gradient_instability", "convergence_to_wrong_solution")
    fix = ("Remove the custom initialisation (the framework's default is scaled to each layer), "
           "or use one scaled to the layer's fan-in (Kaiming for ReLU, Xavier/Glorot for tanh); "
           "keep biases near zero.")

    def intervention(self, finding):
        """Re-initialise every layer the framework's default way before the first step."""
        return Intervention("default_init")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer and the weights from before the first step."""
        return super().applies(ctx) and getattr(ctx.trainer, "initial_state", None) is not None

    def run(self, ctx: ProbeContext):
        """One finding naming the layers whose initial weights are out of scale."""
        tr = ctx.trainer
        odd = _judged(tr.init_outliers())
        if not odd:
            return []
        as_set, default, confirmed = self.compare(ctx, tr.default_init)
        shown = "; ".join(f"'{name}': {_WORDS[o['kind']].format(**o)}"
                          for name, o in list(odd.items())[:4])
        more = f" (and {len(odd) - 4} more)" if len(odd) > 4 else ""
        return [self.finding(
            "architecture", confirmed,
            f"The initial weights are far from the framework's default initialisation: "
            f"{shown}{more}. Two fresh copies trained on the same rows reach a held-out loss of "
            f"{default:.4g} re-initialised by default and {as_set:.4g} from these weights"
            + (": the initialisation holds the training back." if confirmed else
               ": no clearly better, so the initialisation is not what holds it back."),
            _where(ctx), undone=confirmed, strength=0.85 if confirmed else 0.15,
            layers=odd, heldout_as_set=as_set, heldout_default=default)]


def _where(ctx: ProbeContext) -> dict | None:
    """The line that sets the initialisation.

    The ``init``/``*_initializer`` line near the model, followed to where a name it passes was
    set (``kernel_initializer=init`` with ``init="zeros"`` a default of the model's
    ``__init__``).
    """
    found = source_line(ctx, _INIT, ctx.ref("model"), run_start=True)
    if found is None:
        return ctx.ref("model")
    return setting_location(found, "kernel_initializer")


def _judged(odd: dict[str, dict]) -> dict[str, dict]:
    """The outliers worth an experiment.

    A few zero-initialised matrices among normal ones are a deliberate choice (a zero last layer,
    LoRA's B, adaLN-zero): small spreads count only when they are at least half the outliers
    and cover two matrices or more.
    """
    small = {k: o for k, o in odd.items() if o["kind"] == "small"}
    rest = {k: o for k, o in odd.items() if o["kind"] != "small"}
    return odd if len(small) >= 2 and len(small) >= len(rest) else rest
