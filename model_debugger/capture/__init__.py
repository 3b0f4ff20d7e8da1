"""Capture: the Recorder and its framework instruments.

Layout, from the top down (a module imports only modules listed after it and the leaf utilities
``records``, ``_validate``, ``safe_write``, ``redact``: no circle, even through imports made
inside functions; ``tests/test_capture_layout.py`` checks the imports and the circles):

- ``recorder``: the Recorder (the record file, the flusher thread, stdout and TensorBoard
  metrics, errors); attaches an instrument when torch or tensorflow/keras is imported;
- ``torch_instrument``: ``TorchInstrument``, built from ``torch_model`` (model discovery, inputs,
  non-finite localization), ``torch_optim`` (optimizer construction and step hooks),
  ``torch_steps`` (step rows: timing, memory, the norm schedule), ``torch_data`` (DataLoader:
  data wait, epochs), ``torch_losses`` (loss functionals: targets, eval losses),
  ``torch_trainers`` (Lightning, Hugging Face, Accelerate: logged metrics, accumulation),
  ``torch_dist`` (torch.distributed: the rank, collectives, replica checksums), with
  ``torch_grads`` (norms, update ratio, histograms) and ``torch_util`` (replay, small helpers);
- ``keras_instrument``: ``KerasInstrument``, built from ``keras_hooks`` (fit, custom loops),
  ``keras_callbacks`` (the time in the user's callbacks) and ``keras_steps`` (tape and optimizer
  apply), with ``keras_util``;
- ``keeper``, ``keras_keeper``, ``spill``: what Isolate needs after the capture;
- ``warned``: the framework warnings printed during the run, each kind once with the user's line;
- ``instrument``: the base of both instruments, the owner of every undo handle;
- ``metrics``, ``patches``, ``imports``, ``codeloc``, ``norms``, ``_util``: helpers.
"""

from .recorder import CaptureConfig, Recorder, active_recorder, log

__all__ = ["CaptureConfig", "Recorder", "active_recorder", "log"]
