"""Per-step overhead of ``model_debugger.capture()`` on real PyTorch training (CPU).

The same loop runs bare and under ``capture()`` (default settings, record streamed to a file),
alternated in one process after a warm-up, in rounds of three: bare, captured, bare again,
rotating which comes first (a new capture() each round), so that load from other processes on a
shared machine hits every mode alike. Every step is timed, data loading included.

A round's first ``WARM`` steps carry the one-off costs (entering the capture, finding the model,
histograms at step 0). A capture's next 32 steps are its start: it keeps sample batches for
Isolate and counts every target. Both are measured apart from the steady state that follows,
which is what a long run pays per step. Printed per model:

- the median seconds per step in the steady state, bare (both bare runs of every round
  pooled) and captured, and their ratio (the target: <= 1.05);
- ``paired``: the median over rounds of (captured median / bare median) of the same round;
- ``of means``: the ratio of the mean step times (it includes the update/weight ratio measured
  every 50th step);
- ``A/A``: bare again / bare, the same statistic between the two bare runs: how far this
  machine's noise alone moves the ratio in this run;
- ``start``: the median step of a capture's start over the bare median;
- ``one-off ms``: what entering a capture and its first steps cost, once per capture.

    python benchmarks/capture_overhead.py            # 100 rounds, 12 steady steps per mode
    python benchmarks/capture_overhead.py --quick    # 6 rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_debugger  # noqa: E402
from model_debugger.capture.keeper import MAX_BATCHES  # noqa: E402
from model_debugger.capture.torch_losses import _ALL_BATCHES  # noqa: E402
from model_debugger.capture.torch_steps import DETAIL_WARMUP  # noqa: E402


def mlp_setup():
    """784-512-256-10 MLP, batch 128, Adam."""
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    data = TensorDataset(torch.randn(128 * 16, 784), torch.randint(0, 10, (128 * 16,)))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), data, 128


class SmallCNN(nn.Module):
    """Two conv layers on 1x28x28 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def cnn_setup():
    """SmallCNN, batch 64, SGD with momentum."""
    model = SmallCNN()
    data = TensorDataset(torch.randn(64 * 16, 1, 28, 28), torch.randint(0, 10, (64 * 16,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), data, 64


CLOCK = time.perf_counter


def train(model, opt, loader, steps: int) -> list[float]:
    """The training loop under test; returns the seconds of each step (data loading included)."""
    times = []
    last = CLOCK()
    while len(times) < steps:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            now = CLOCK()
            times.append(now - last)
            last = now
            if len(times) == steps:
                break
    return times


WARM = 2  # steps per round that carry the one-off costs
# a capture's start: it keeps sample batches for Isolate, counts every target and records full
# detail (gradient norms, the step's time split, ...) at every step (its warm-up) this long
START = WARM + max(MAX_BATCHES, _ALL_BATCHES, DETAIL_WARMUP)


def bench(name: str, setup, rounds: int, steps: int, tmp: str) -> dict:
    """Alternate bare and captured rounds of ``steps`` steps; a new capture() each round.

    A captured round runs ``START - WARM`` more steps first: the capture's start, measured apart.
    """
    torch.manual_seed(0)
    model, opt, data, batch = setup()
    loader = DataLoader(data, batch_size=batch, shuffle=True)

    def bare() -> tuple[list[float], list[float], float]:
        times = train(model, opt, loader, WARM + steps)
        return times[:WARM], times[WARM:], 0.0

    def captured() -> tuple[list[float], list[float], float]:
        path = os.path.join(tmp, f"{name}.jsonl")
        if os.path.exists(path):
            os.remove(path)
        t0 = CLOCK()
        with model_debugger.capture(path):
            t1 = CLOCK()
            times = train(model, opt, loader, START + steps)
            t2 = CLOCK()
        start["captured"] += times[WARM:START]
        return times[:WARM], times[START:], (t1 - t0) + (CLOCK() - t2)  # entering, leaving

    start: dict[str, list[float]] = {"captured": []}
    bare()  # warm-up of both modes, not measured
    captured()
    start["captured"] = []
    modes = [("bare", bare), ("captured", captured), ("bare2", bare)]
    times: dict[str, list[float]] = {mode: [] for mode, _ in modes}
    paired, one_off = [], []
    for r in range(rounds):
        this = {}
        for mode, fn in modes[r % 3:] + modes[:r % 3]:  # each mode first, second and third alike
            warm, steady, enter_exit = fn()
            this[mode] = (steady, sum(warm) + enter_exit)
            times[mode] += steady
        bare_steps = this["bare"][0] + this["bare2"][0]
        paired.append(statistics.median(this["captured"][0]) / statistics.median(bare_steps))
        one_off.append(this["captured"][1] - this["bare"][1])
    times["pooled"] = times["bare"] + times["bare2"]  # both bare runs of every round
    med = {mode: statistics.median(v) for mode, v in times.items()}
    mean = {mode: statistics.fmean(v) for mode, v in times.items()}
    return {"model": name, "bare": med["pooled"], "captured": med["captured"],
            "ratio": med["captured"] / med["pooled"], "paired": statistics.median(paired),
            "of_means": mean["captured"] / mean["pooled"], "noise": med["bare2"] / med["bare"],
            "start": statistics.median(start["captured"]) / med["pooled"],
            "one_off_ms": 1000 * statistics.median(one_off)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (6 rounds)")
    parser.add_argument("--rounds", type=int, help="rounds per mode (default 100)")
    parser.add_argument("--steps", type=int, help="steady steps measured per round and mode (default 12)")
    parser.add_argument("--model", choices=["mlp", "cnn"], action="append")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared "
                             "machine; use with --threads 1)")
    ns = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if ns.clock == "cpu" else time.perf_counter
    if ns.threads:
        torch.set_num_threads(ns.threads)
    rounds = ns.rounds or (6 if ns.quick else 100)
    steps = max(ns.steps or 12, 2)
    models = {"mlp": mlp_setup, "cnn": cnn_setup}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {ns.clock} clock, "
          f"{rounds} rounds x {steps} steps per mode")
    print(f"{'model':<6} {'bare s/step':>12} {'captured s/step':>16} {'ratio':>7} "
          f"{'paired':>7} {'of means':>9} {'A/A':>6} {'start':>6} {'one-off ms':>11}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.model or list(models):
            r = bench(name, models[name], rounds, steps, tmp)
            worst = max(worst, r["ratio"])
            print(f"{name:<6} {r['bare']:>12.5f} {r['captured']:>16.5f} {r['ratio']:>7.3f} "
                  f"{r['paired']:>7.3f} {r['of_means']:>9.3f} {r['noise']:>6.3f} "
                  f"{r['start']:>6.3f} "
                  f"{r['one_off_ms']:>11.1f}",
                  flush=True)
    print(f"worst ratio {worst:.3f} ({'within' if worst <= 1.05 else 'above'} the 1.05 target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
