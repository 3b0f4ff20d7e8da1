"""``compute_settings``: a process-wide compute setting that makes this machine slower.

Settings that slow the run down: two that look like speed-ups and are slowdowns on the wrong
hardware, and debugging modes left on:

- more intra-op threads than the cores the process may use (``torch.set_num_threads(32)`` on a
  2-core machine): the threads fight for the cores and every operation waits on the slowest;
- a float16 mixed-precision policy (``keras.mixed_precision.set_global_policy("mixed_float16")``)
  with no GPU: CPUs without native half-precision arithmetic emulate it, far slower than float32;
- autograd anomaly detection (``torch.autograd.set_detect_anomaly(True)``: every operation
  records a traceback) or eager execution (Keras ``compile(run_eagerly=True)``,
  ``tf.config.run_functions_eagerly(True)``), recorded by the capture (``debug_mode``): the
  steps of a fresh copy timed with the mode and without it, located where it is turned on
  (``training_loop``).

Measured directly, on this machine, in the run's own process: the same training steps of a
fresh copy timed with the run's thread count and with one thread per core; for the policy, the
training steps of a fresh copy under it and of one whose layers compute in float32 (a model
Keras cannot rebuild that way: the same float16 and float32 matrix products). Each pair is
timed :data:`ROUNDS` times, alternated, and the fastest of each kept, so that load from other
processes slows both alike. Confirmed when the run's setting is :data:`GAIN` times slower and
the run's steps took long enough for that to matter. The cause of the first two is
how the code drives the hardware (``hardware``), of a debugging mode the code
(``training_loop``); on a run that looked healthy the finding
re-classifies it ``performance_issue``. Located where the setting is made.
"""

from __future__ import annotations

import os
import re
import time

from ._heldout import source_line
from .base import Probe, ProbeContext, register

GAIN = 1.5              # the run's setting this many times slower than the alternative
MIN_RUN_SECONDS = 2.0   # the run's steps took at least this long (else not worth a finding)
ROUNDS = 2              # each timing taken this many times, alternated; the fastest kept
_THREADS = re.compile(r"set_num_threads\s*\(|set_intra_op_parallelism_threads\s*\(")
_POLICY = re.compile(r"set_global_policy\s*\(|mixed_float16|[\"']float16[\"']")
# debugging modes left on (``debug_mode`` events): what it is, where it is set, the fix
_DEBUG = {"detect_anomaly": ("autograd anomaly detection",
                             re.compile(r"set_detect_anomaly\s*\(\s*(?:mode\s*=\s*)?(?:True|1)\b"
                                        r"|(?<!set_)\bdetect_anomaly\s*\(|\bdetect_anomaly\s*=\s*True"),
                             "Turn it off (torch.autograd.set_detect_anomaly(False)) once the "
                             "NaN it was hunting is found."),
          "run_eagerly": ("eager execution (every step run op by op in Python)",
                          re.compile(r"run_eagerly\s*=\s*True|run_functions_eagerly\s*\(\s*True"),
                          "Remove run_eagerly=True (or tf.config.run_functions_eagerly(True)): "
                          "fit then compiles the step.")}


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def step_seconds(ctx: ProbeContext) -> float:
    """Seconds the run's training steps took (steps x their mean time)."""
    sig = ctx.signals or {}
    return sig.get("steps", 0) * sig.get("step_ms", 0.0) / 1000.0


@register
class ComputeSettings(Probe):
    """Threads beyond the cores, or float16 without a GPU, timed against the alternative."""

    id = "compute_settings"
    cost = 1
    categories = ("healthy", "performance_issue")  # the time, not another category's cause
    reveals = "performance_issue"
    needs_live = True
    frameworks = ("torch", "keras")
    fix = ("Leave the thread count at its default (one per core), use float16 mixed "
           "precision only on a GPU that computes in it, and turn debugging modes off "
           "(anomaly detection, run_eagerly) once done with them.")

    def run(self, ctx: ProbeContext):
        """A confirmed finding when the run's setting is clearly slower here; else nothing."""
        run_seconds = step_seconds(ctx)
        if run_seconds < MIN_RUN_SECONDS or ctx.trainer is None:
            return []
        mode = (ctx.run.first("debug_mode") or {}).get("mode")
        found = self._debug(ctx, mode, run_seconds) if mode in _DEBUG else []
        if found:
            return found
        if ctx.framework == "torch":
            return self._threads(ctx, run_seconds)
        return self._policy(ctx, run_seconds)

    def _threads(self, ctx: ProbeContext, run_seconds: float):
        """A copy's steps timed at the run's thread count and at one thread per core."""
        import torch

        tr, threads, have = ctx.trainer, torch.get_num_threads(), cores()
        if threads <= have:
            return []
        batch = _batch(ctx)

        def at(count):
            def rate():
                torch.set_num_threads(count)
                try:
                    return tr.throughput(batch)
                finally:
                    torch.set_num_threads(threads)
            return rate

        slow, fast = _fastest(at(threads), at(have))
        gain = fast / slow if slow > 0 else 0.0
        if gain < GAIN:
            return []
        return [self.finding(
            "hardware", True,
            f"The run computes with {threads} threads on {have} core{'s' if have > 1 else ''}: "
            f"the threads fight for the cores. A fresh copy trains {slow:,.0f} rows/s with "
            f"{threads} threads and {fast:,.0f} rows/s with {have} ({gain:.1f}x); the run's "
            f"steps took {run_seconds:.1f} s.",
            self._where(ctx, _THREADS), strength=0.8, undone=True, decisive=True,
            threads=threads, cores=have, rows_per_second=slow, rows_per_second_per_core=fast,
            gain=gain, run_step_seconds=run_seconds)]

    def _policy(self, ctx: ProbeContext, run_seconds: float):
        """Float16 and float32 products timed, for a float16 policy on TensorFlow's CPU."""
        import keras

        if keras.backend.backend() != "tensorflow":
            return []  # (another backend's devices are not TensorFlow's to list)
        import tensorflow as tf

        policy = keras.mixed_precision.global_policy().name
        if "float16" not in policy or "bfloat16" in policy or \
                tf.config.list_physical_devices("GPU"):
            return []
        tr, batch = ctx.trainer, _batch(ctx)
        try:
            half_model, full_model = tr.fresh_model(), tr.float32_copy()
        except Exception:  # noqa: BLE001 - a model no copy can be made of: the products
            half_model = full_model = None
        if full_model is not None and half_model is not None:
            half, full = _fastest(lambda: tr.throughput(batch, model=half_model),
                                  lambda: tr.throughput(batch, model=full_model))
            gain = full / half if half > 0 else 0.0
            measured = (f"a fresh copy of the model trains {half:,.0f} rows/s under the policy "
                        f"and {full:,.0f} rows/s with its layers in float32")
            what = "model_steps"
        else:
            slow, fast = _fastest(lambda: 1 / _matmul_seconds(tf, "float16"),
                                  lambda: 1 / _matmul_seconds(tf, "float32"))
            half, full = 1 / slow, 1 / fast
            gain = half / full if full > 0 else 0.0
            measured = (f"the same matrix products take {half * 1e3:.1f} ms in float16 and "
                        f"{full * 1e3:.1f} ms in float32")
            what = "matmul"
        if gain < GAIN:
            return []
        return [self.finding(
            "hardware", True,
            f"The run trains under the '{policy}' policy on a machine without a GPU: this CPU "
            f"computes float16 {gain:.1f}x slower than float32 ({measured}); the run's steps "
            f"took {run_seconds:.1f} s.",
            self._where(ctx, _POLICY), strength=0.8, undone=True, decisive=True,
            policy=policy, timed=what, float16=half, float32=full, gain=gain,
            run_step_seconds=run_seconds)]

    def _debug(self, ctx: ProbeContext, mode: str, run_seconds: float):
        """A copy's steps timed with the run's debugging mode on and off."""
        tr, batch = ctx.trainer, _batch(ctx)
        if mode == "detect_anomaly":
            import torch

            before = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())

            def switch(on):  # (no NaN check while timing: a copy's NaN must not raise)
                if isinstance(on, tuple):
                    torch.autograd.set_detect_anomaly(on[0], check_nan=on[1])
                else:
                    torch.autograd.set_detect_anomaly(on, check_nan=False)
        else:
            import tensorflow as tf

            before = tf.config.functions_run_eagerly()
            switch = tf.config.run_functions_eagerly

        def with_mode(on: bool):
            def rate():
                switch(on)
                try:
                    return tr.throughput(batch)
                finally:
                    switch(before)
            return rate

        try:
            slow, fast = _fastest(with_mode(True), with_mode(False))
        except RuntimeError:  # a copy that cannot train here: nothing measured
            return []
        gain = fast / slow if slow > 0 else 0.0
        if gain < GAIN:
            return []
        what, pattern, undo = _DEBUG[mode]
        return [self.finding(
            "training_loop", True,
            f"The run trains with {what} on, a debugging mode: a fresh copy trains "
            f"{slow:,.0f} rows/s with it and {fast:,.0f} rows/s without ({gain:.1f}x); the "
            f"run's steps took {run_seconds:.1f} s. {undo}",
            self._where(ctx, pattern), strength=0.8, undone=True, decisive=True, mode=mode,
            rows_per_second=slow, rows_per_second_without=fast, gain=gain,
            run_step_seconds=run_seconds)]

    @staticmethod
    def _where(ctx: ProbeContext, pattern) -> dict | None:
        return source_line(ctx, pattern, near=ctx.ref("model")) or ctx.ref("model")


def _batch(ctx: ProbeContext) -> int:
    """The run's batch size (the first kept batch's rows), else 32."""
    return int(ctx.train_batches[0][1].shape[0]) if ctx.train_batches else 32


def _fastest(first, second) -> tuple[float, float]:
    """The highest of :data:`ROUNDS` readings of two rates, taken alternately."""
    a, b = [], []
    for _ in range(ROUNDS):
        a.append(first())
        b.append(second())
    return max(a), max(b)


def _matmul_seconds(tf, dtype: str, size: int = 256, repeats: int = 20) -> float:
    """Seconds for ``repeats`` products of two ``size`` x ``size`` matrices in ``dtype``."""
    a = tf.random.stateless_normal((size, size), seed=(1, 2), dtype=dtype)
    (a @ a).numpy()  # the first call's set-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = a @ a
    out.numpy()
    return time.perf_counter() - t0
