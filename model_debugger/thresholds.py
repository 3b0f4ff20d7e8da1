"""Thresholds shared by Classify and the probes: a leaf module (it imports nothing).

Classify's rule table reads them (:mod:`model_debugger.classify` re-exports every name, so tests
can probe both sides of a rule there); a probe that restates a rule's condition (``data_volume``:
the validation loss has risen; ``lr_range``: the gradient norm exploded) reads the same number
here instead of importing classification code. :mod:`model_debugger.defining` words the targets a
fix should reach with them.
"""

from __future__ import annotations

MIN_STEPS = 5
WINDOW_ROWS = 32             # rows behind one loss reading at least (else readings are averaged)
PLATEAU_DROP = 0.05          # less than 5% loss decrease over the run is a plateau
BASELINE_MARGIN = 0.95       # final loss above 95% of the constant predictor's loss
FLOOR_SHARE = 0.4            # a plateau at >= 40% of it: suspect, to be shown by experiment
SETTLED_FLOOR = 0.15         # a long run settled at >= 15%: suspect too, when ...
SETTLED_TAIL = 0.1           # ... its second half fell < 10% (flat, not slowly learning)
TAIL_DROP = 0.3              # ... unless still learning fast: the second half fell >= 30%
UNREACHABLE_SHARE = 0.05     # targets an output floored at 0 cannot reach: a wrong solution
UNTRAINED_SHARE = 0.5        # most of the model never updated (frozen, not in the optimizer) ...
LR_STALLED = 0.5             # ... or the rate sat below 1% of its peak for half the run or more
HELD_FLOOR = 0.05            # ... and the loss ends above 5% of the constant predictor's: suspect
FEW_STEPS = 100              # a run of fewer optimizer steps may have stopped before it learned
UNBOUNDED_LOSS = 1e6         # a training loss below -1e6 ...
UNBOUNDED_RATIO = 1e4        # ... and 1e4x the untrained model's |loss|: no minimum to reach
DIVERGE_RATIO = 2.0          # final loss at least twice the initial loss
WORSE_RATIO = 1.25           # ... or 1.25x, above the constant predictor's, after a peak of
PEAK_RATIO = 2.0             # ... twice the initial loss: the updates drove it up and left it there
SPIKE_RATIO = 10.0           # a finite loss 10x the initial one
START_RATIO = 10.0           # an untrained model's loss 10x the constant predictor's
GRAD_GROWTH = 1e3            # max gradient norm / initial gradient norm
GRAPHS_KEPT = 0.9           # share of past steps' loss tensors (and graphs) still alive
NOT_RESET = 0.9             # share of steps whose gradients were never reset (added to)
GROWTH_WITH_LEARNING = 0.5   # ... counts only while the loss has not fallen by half (zero-init)
VANISH_RATIO = 1e-3          # first-layer / last-layer median gradient norm
RSS_GROWTH_MB = 100.0        # memory growth over the run (after warm-up)
RSS_R2 = 0.8                 # ... that is steady (linear fit)
RSS_STILL_GROWING = 0.25     # ... and, over several epochs, the last one grows at >= 25% that rate
DATA_WAIT_FRACTION = 0.5     # data wait share of step time
DATA_WAIT_MS = 5.0           # ... and at least this much per step
OVERHEAD_SHARE = 0.5         # share of each step outside data, forward, backward and step
OVERHEAD_MS = 10.0           # ... and at least this much per step (a trainer's bookkeeping is less)
SLOW_TOTAL_S = 1.0           # ... and, over the whole run, at least this many seconds: less is
#                              not worth a diagnosis, and a loaded machine's noise on a short run
VAL_RISE = 0.10              # validation loss 10% above its minimum at the end
VAL_RISE_SHARE = 0.05        # ... giving back >= 5% of what it gained over the constant predictor
ACC_GAP = 0.15               # training accuracy (or its bound) 15 points above validation's
TRAIN_NOT_RISING = 1.02      # train loss at the end not above its value at the val minimum
TRIVIAL_METRIC_MARGIN = 0.015  # accuracy no more than 1.5 points above the majority rate
TRIVIAL_F1 = 0.05
TRIVIAL_ERROR_SHARE = 0.9     # a regression error >= 90% of a constant prediction's
ONE_VALUE_LOSS = 0.05        # targets all one value: the loss fell below 5% of its first value
LOSS_FALLS = 0.10            # "loss falls": at least a 10% decrease
GPU_IDLE_UTIL = 30.0         # median GPU utilisation below 30% ...
GPU_IDLE_STEP_MS = 20.0      # ... with steps long enough for the idle time to matter
UNPAIRED_READS = 3           # steps whose one-column output gradient was read (a hand-written
UNPAIRED_CORR = 0.999        # loss), each affine in the prediction alone: no row paired
RETRACED_MIN = 10            # a custom loop's compiled step traced at least this many times ...
RETRACED_SHARE = 0.25        # ... and on at least this share of the optimizer steps
UPDATE_RATIO_LOW = 1e-5      # median update/weight ratio: steps too small to move the weights
UPDATE_RATIO_HIGH = 1e-1     # ... steps that overshoot
STRAGGLER_SHARE = 0.25       # one rank's own work per step exceeds the others' by 25% of a step
STRAGGLER_MS = 2.0           # ... and by at least this much per step
DESYNC_REL = 1e-5            # replicas' parameter checksums apart by more than this (relative)
UPDATES_APART = 0.1          # ... or one rank made >= 10% fewer optimizer steps than another
