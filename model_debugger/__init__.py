"""model_debugger: an evidence-first diagnostician for ML training problems.

Importing this package imports neither torch nor tensorflow; instruments attach when the user's
code imports them.
"""

from __future__ import annotations

from .capture import CaptureConfig, Recorder, log

__version__ = "0.1.0"
__all__ = ["CaptureConfig", "Recorder", "capture", "current_session", "log", "__version__"]


def capture(path: str | None = None, **config) -> Recorder:
    """Record a training run: ``with model_debugger.capture("run.jsonl") as rec: train()``.

    Parameters
    ----------
    path : str, optional
        Where to stream the record as JSON lines; None keeps it in memory (``rec.events``).
    **config
        ``CaptureConfig`` fields: ``hist_every``, ``update_every``, ``module_norms``,
        ``parse_stdout``, ``norm_every``.

    Returns
    -------
    Recorder
        A context manager; every hook it installs is removed when the block exits.
    """
    return Recorder(path, CaptureConfig(**config))


def current_session():
    """The notebook kernel's debugging session (``.session``, ``.report()``, ``.tracker``).

    It belongs to the magics ``%load_ext model_debugger`` registered; its DebugSession is
    created on first use.

    Returns
    -------
    model_debugger.notebook.NotebookSession

    Raises
    ------
    RuntimeError
        When the extension is not loaded in this kernel.
    """
    from .notebook import current_session as _current

    return _current()


def load_ipython_extension(ipython) -> None:
    """``%load_ext model_debugger``: register the magics (imports neither torch nor tensorflow)."""
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext model_debugger``: remove every magic and drop the kernel's session."""
    from .magics import unload

    unload(ipython)
