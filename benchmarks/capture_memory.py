"""Memory cost of ``model_debugger.capture()`` on a large CPU model, and record bytes per step.

Each measurement runs in a fresh child process (peak RSS is per process):

- ``bare``: a ~75M-parameter MLP (300 MB of float32 weights) trained for 60 SGD steps;
- ``captured``: the same under ``capture()`` (default settings, record streamed to a file);
  the Recorder is kept after the block (``with ... as rec``), as a notebook does;
- ``bytes``: 2500 ``Linear(2, 2)`` layers (5000 parameter tensors) trained 60 steps under
  ``capture(norm_every=1)``; the record's ``step`` lines are measured.

Printed: peak RSS of each mode and the difference, what the captured process still holds after
the block against the bare one after its loop (``held``), and bytes per ``step`` event.

    python benchmarks/capture_memory.py              # 75M parameters
    python benchmarks/capture_memory.py --width 3000 # smaller (27M)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile

MB = 2 ** 20


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _big(width: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width))


def _train(model, steps: int = 60) -> None:
    import torch
    import torch.nn.functional as F

    width = model[0].in_features
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(8, width), torch.randn(8, width)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def child(mode: str, width: int) -> dict:
    import torch  # noqa: F401 - imported before the baseline reading, in both modes

    import model_debugger

    out = {"mode": mode}
    if mode == "bytes":
        from torch import nn

        class Many(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2500))

            def forward(self, x):
                return torch.stack([layer(x) for layer in self.layers]).sum(0)

        many = Many()
        opt = torch.optim.SGD(many.parameters(), lr=1e-3)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "record.jsonl")
            with model_debugger.capture(path, norm_every=1):
                for _ in range(60):
                    loss = many(torch.randn(8, 2)).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            with open(path, encoding="utf-8") as fh:
                sizes = [len(line) for line in fh if json.loads(line)["t"] == "step"]
        out["tensors"] = sum(1 for _ in many.parameters())
        out["step_bytes_mean"] = sum(sizes) / len(sizes)
        out["step_bytes_max"] = max(sizes)
        return out
    model = _big(width)
    out["params"] = sum(p.numel() for p in model.parameters())
    out["start_rss"] = _rss()
    if mode == "bare":
        _train(model)
        gc.collect()
        out["end_rss"] = _rss()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            with model_debugger.capture(os.path.join(tmp, "record.jsonl")) as rec:
                _train(model)
            gc.collect()
            out["end_rss"] = _rss()  # the Recorder (and its keeper) still held
            out["kept"] = rec.keeper is not None
    out["peak_rss"] = _peak()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=5000, help="MLP width (3 layers: 3 w^2 params)")
    ap.add_argument("--child", choices=("bare", "captured", "bytes"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(child(ns.child, ns.width)))
        return
    res = {}
    for mode in ("bare", "captured", "bytes"):
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--width",
                               str(ns.width)], capture_output=True, text=True, check=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        res[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    bare, cap, nb = res["bare"], res["captured"], res["bytes"]
    weights = bare["params"] * 4
    print(f"model: {bare['params'] / 1e6:.1f}M parameters, {weights / MB:.0f} MB of weights")
    print(f"peak RSS  bare {bare['peak_rss'] / MB:8.0f} MB   captured {cap['peak_rss'] / MB:8.0f} MB"
          f"   cost {(cap['peak_rss'] - bare['peak_rss']) / MB:+.0f} MB"
          f" ({(cap['peak_rss'] - bare['peak_rss']) / weights:.0%} of the weights)")
    print(f"after the loop  bare {bare['end_rss'] / MB:8.0f} MB   captured (Recorder kept) "
          f"{cap['end_rss'] / MB:8.0f} MB   held {(cap['end_rss'] - bare['end_rss']) / MB:+.0f} MB")
    print(f"record at {nb['tensors']} parameter tensors: {nb['step_bytes_mean'] / 1e3:.1f} KB per "
          f"step (max {nb['step_bytes_max'] / 1e3:.1f} KB)")


if __name__ == "__main__":
    main()
