"""Former home of the export's figures: they are drawn by :mod:`model_debugger.figures` now.

Kept so that code importing ``model_debugger._plots`` goes on working; every name is the figure
factory's own function.
"""

from .figures import (  # noqa: F401 - re-exported
    DPI,
    HEIGHT,
    MAX_MODULES,
    WIDTH,
    before_after_loss_figure,
    figure_png,
    first_nonfinite,
    grad_norm_figure,
    histogram_figure,
    loss_figure,
    new_figure,
    verification_figure,
)
