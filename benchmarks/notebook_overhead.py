"""Cost of ``%%reproduce`` in a real Jupyter kernel against the same cell run bare.

One ipykernel (``jupyter_client``) runs a small digits MLP cell (``sklearn`` digits, 64-128-10,
Adam, batch 32, ``EPOCHS`` epochs: 3528 optimizer steps) in rounds that alternate the
modes: bare, reproduce, reproduce, bare, ... so that load from other processes hits both alike.
In the ``reproduce`` mode the same code runs under ``%%reproduce --seed 0 --runs 1`` with its live
panel drawn in the kernel (the widget messages are sent as a browser would receive them). Each
round is timed twice:

- ``train``: the training loop itself, measured inside the cell (``time.perf_counter`` around
  the loop; under ``%%reproduce`` that is the instrumented loop, live panel included);
- ``cell``: the whole execute request, from sending it to the kernel going idle (under
  ``%%reproduce`` that adds Classify and the views).

Printed: the median of each mode, their ratio, the median ratio over adjacent pairs of rounds,
and the bare-vs-bare noise floor (the median |difference| of adjacent bare rounds relative to
their median). The issue's target is ``train`` at most 1.10x the bare loop.

    python benchmarks/notebook_overhead.py            # 6 rounds per mode
    python benchmarks/notebook_overhead.py --quick    # 2 rounds
    python benchmarks/notebook_overhead.py --model cnn  # a small CNN (21 epochs, 1176 steps)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 63  # 3528 steps: the size of the run the issue timed (3520 steps of batch 32)

SETUP = f"""
import sys
sys.path.insert(0, {ROOT!r})
import time
import numpy as np
from sklearn.datasets import load_digits
%load_ext model_debugger
"""

TRAIN_TEMPLATE = """
import torch
torch.manual_seed(0)
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
model = MODEL
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
t0 = time.perf_counter()
for epoch in range(EPOCHS):
    perm = torch.randperm(len(X))
    for i in range(0, len(X) - 31, 32):
        idx = perm[i:i + 32]
        opt.zero_grad()
        loss = loss_fn(model(X[idx]), y[idx])
        loss.backward()
        opt.step()
__bench_train = time.perf_counter() - t0
"""
# the model of the issue (a per-step cost of a fraction of a millisecond), and a small CNN on the
# same 8x8 images (about 5 ms a step on a 2-core machine: what a first notebook model costs)
MODELS = {
    "mlp": "torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), "
           "torch.nn.Linear(128, 10))",
    "cnn": "torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8, 8)), "
           "torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), "
           "torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), "
           "torch.nn.Flatten(), torch.nn.Linear(64 * 16, 128), torch.nn.ReLU(), "
           "torch.nn.Linear(128, 10))",
}


def _execute(client, code: str, timeout: float = 600) -> float:
    """Run ``code``; the wall time from the request to the kernel going idle."""
    t0 = time.perf_counter()
    reply = client.execute_interactive(code, timeout=timeout, output_hook=_keep_errors)
    seconds = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {reply['content'].get('ename')}: "
                           f"{reply['content'].get('evalue')}")
    return seconds


_errors: list[str] = []


def _keep_errors(msg) -> None:
    if msg["msg_type"] == "error":
        _errors.append(msg["content"].get("evalue", ""))


def _value(client, expr: str) -> float:
    out: list = []

    def hook(msg):
        if msg["msg_type"] == "execute_result":
            out.append(msg["content"]["data"]["text/plain"])

    client.execute_interactive(expr, timeout=60, output_hook=hook)
    return float(json.loads(out[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp",
                        help="mlp: the issue's digits MLP (default); cnn: a small CNN")
    args = parser.parse_args()
    epochs = EPOCHS if args.model == "mlp" else EPOCHS // 3
    train = TRAIN_TEMPLATE.replace("MODEL", MODELS[args.model]).replace("EPOCHS", str(epochs))
    rounds = 2 if args.quick else args.rounds

    from jupyter_client.manager import start_new_kernel

    with tempfile.TemporaryDirectory() as tmp:
        km, client = start_new_kernel(kernel_name="python3", cwd=tmp,
                                      env=dict(os.environ, MPLBACKEND="Agg",
                                               OMP_NUM_THREADS="1"))
        try:
            _execute(client, SETUP)
            _execute(client, train)  # warm-up: imports, allocator, first %%reproduce below
            _execute(client, "%%reproduce --seed 0 --runs 1\n" + train)
            times: dict[str, dict[str, list[float]]] = {
                m: {"train": [], "cell": []} for m in ("bare", "reproduce")}
            order = []
            for r in range(rounds):
                order += ["bare", "reproduce"] if r % 2 == 0 else ["reproduce", "bare"]
            for mode in order:
                code = train if mode == "bare" else "%%reproduce --seed 0 --runs 1\n" + train
                if mode == "reproduce":
                    _execute(client, "from model_debugger.notebook import current_session\n"
                                     "current_session().new_session()")
                times[mode]["cell"].append(_execute(client, code))
                times[mode]["train"].append(_value(client, "__bench_train"))
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)

    name = "digits MLP 64-128-10" if args.model == "mlp" else "digits CNN 32-64 conv, 128 fc"
    print(f"{name}, batch 32, {epochs} epochs; {rounds} rounds per mode "
          f"(alternated), one kernel")
    for what in ("train", "cell"):
        bare, rep = times["bare"][what], times["reproduce"][what]
        pairs = [r / b for b, r in zip(bare, rep)]
        floor = [abs(a - b) / statistics.median(bare) for a, b in zip(bare, bare[1:])]
        print(f"  {what:5s}: bare {statistics.median(bare):.3f} s, reproduce "
              f"{statistics.median(rep):.3f} s, ratio {statistics.median(rep) / statistics.median(bare):.3f}x"
              f" (paired median {statistics.median(pairs):.3f}x; bare-vs-bare noise floor "
              f"{statistics.median(floor) if floor else float('nan'):.3f})")
    if _errors:
        print("errors:", _errors[:3])


if __name__ == "__main__":
    main()
