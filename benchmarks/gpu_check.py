"""GPU check: the CUDA paths of capture, classification, Isolate and Verify, on a real GPU.

Not part of the test suite (CI has no GPU). Run on a machine with CUDA:

    PYTHONPATH=. python3 benchmarks/gpu_check.py [OUT_DIR]

Each scenario is a small training script on ``cuda`` diagnosed through the CLI; the check prints
what was recorded and classified and exits non-zero when an expectation fails:

- ``healthy``: per-step CUDA memory and GPU utilisation are recorded; classified healthy.
- ``nan``: a learning rate far too high; gradient_instability with the first non-finite module.
- ``oom``: a batch that cannot fit; ``torch.OutOfMemoryError`` ends the run with a partial record,
  memory_issue, and ``batch_memory`` reads the free GPU memory from the error message.
- ``leak``: outputs with their graphs kept across steps; GPU memory (not RSS) grows: memory_issue,
  ``graph_retention`` confirmed; its fixed twin (``.item()``) is verified ``resolved``.
- ``idle``: CPU work in the loop body keeps the GPU waiting: performance_issue (``gpu_idle``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

HEAD = """
import os
import numpy as np
import torch
from torch import nn
torch.manual_seed(0)
dev = os.environ.get("GPU_CHECK_DEVICE", "cuda")
"""

SCRIPTS = {
    "healthy": """
X = torch.randn(4096, 32, device=dev)
y = (X[:, :4].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 2)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(300):
    idx = torch.randint(0, len(X), (256,), device=dev)
    loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
    "nan": """
X = torch.randn(1024, 6, device=dev)
y = X @ torch.randn(6, 1, device=dev)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=3.0)
for step in range(200):
    idx = torch.randint(0, len(X), (64,), device=dev)
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
    "oom": """
model = nn.Sequential(nn.Linear(4096, 8192), nn.ReLU(), nn.Linear(8192, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch_size in [256] * 20 + [4_000_000]:
    x = torch.randn(batch_size, 4096, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
    "leak": """
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for step in range(120):
    x = torch.randn(1024, 1024, device=dev)
    y = torch.randint(0, 10, (1024,), device=dev)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(model(x))  # kept "for later": each output holds its graph and activations
""",
    "idle": """
X = torch.randn(4096, 32, device=dev)
y = (X[:, :4].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(150):
    m = np.random.rand(300, 300)
    for _ in range(4):
        np.linalg.svd(m)  # CPU preprocessing in the loop body: the GPU waits
    idx = torch.randint(0, len(X), (256,), device=dev)
    loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
""",
}

EXPECT = {"healthy": "healthy", "nan": "gradient_instability", "oom": "memory_issue",
          "leak": "memory_issue", "idle": "performance_issue"}


def cli(*args: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "model_debugger.cli", *args, "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode not in (0, 3):
        print(proc.stderr[-3000:])
        raise SystemExit(f"model-debugger {args[0]} failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(out: str) -> int:
    import torch

    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    work = tempfile.mkdtemp()
    failures = []
    summary = {}
    only = os.environ.get("GPU_CHECK_ONLY")
    for name, body in SCRIPTS.items():
        if only and name not in only.split(","):
            continue
        path = os.path.join(work, f"{name}.py")
        with open(path, "w") as fh:
            fh.write(textwrap.dedent(HEAD) + textwrap.dedent(body))
        rep = cli("diagnose", path, "--runs", "1", "--seed", "0", "--root",
                  os.path.join(work, "s"), "--probe-seconds", "40")
        cls = rep["classification"]
        record = os.path.join(rep["session_dir"], rep["reproduce"]["record"])
        steps = [json.loads(line) for line in open(record) if '"t": "step"' in line]
        util = [s["gpu_util"] for s in steps if s.get("gpu_util") is not None]
        cuda = [s.get("cuda") for s in steps if s.get("cuda") is not None]
        found = [(f["check"], f["root_cause"], f["confirmed"]) for f in rep["findings"]]
        summary[name] = {"category": cls["primary"], "secondary": cls["secondary"],
                         "evidence": cls["evidence"], "findings": found,
                         "error": rep["reproduce"]["error"], "steps": len(steps),
                         "cuda_first_last_mb": [round(c / 2**20, 1) for c in cuda[:1] + cuda[-1:]],
                         "gpu_util": util[:20]}
        print(f"\n== {name}: {cls['primary']} {cls['secondary']} steps={len(steps)} "
              f"error={rep['reproduce']['error']!s:.120}")
        for ev in cls["evidence"]:
            print(f"   {ev['signal']} = {ev['value']}  ({ev['detail']})")
        print("   findings:", found[:5])
        print("   cuda MB first/last:", summary[name]["cuda_first_last_mb"], "gpu_util:", util[:12])
        if cls["primary"] != EXPECT[name]:
            failures.append(f"{name}: {cls['primary']} != {EXPECT[name]}")
        if not cuda:
            failures.append(f"{name}: no CUDA memory recorded")
        if name == "oom":
            bm = [f for f in rep["findings"] if f["check"] == "batch_memory"]
            print("   batch_memory:", bm[0]["evidence"] if bm else None)
            if not bm or not bm[0]["confirmed"]:
                failures.append("oom: batch_memory not confirmed")
        if name == "leak":
            fixed = path.replace("leak.py", "leak_fixed.py")
            with open(path) as fh, open(fixed, "w") as gh:
                gh.write(fh.read().replace("history.append(model(x))",
                                           "history.append(loss.item())"))
            ver = cli("verify", rep["session_dir"], "--fixed", fixed, "--yes", "--seeds", "2")
            v = ver.get("verification") or {}
            summary["leak_verify"] = {k: v.get(k) for k in ("verdict", "metric", "before",
                                                             "after", "remaining_symptom")}
            print("   verify:", v.get("verdict"), v.get("metric"),
                  (v.get("before") or {}).get("values"), (v.get("after") or {}).get("values"),
                  ver.get("refused"))
            if v.get("verdict") != "resolved":
                failures.append(f"leak: verify {v.get('verdict')} {ver.get('refused')}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.json"), "w") as fh:
        json.dump({"summary": summary, "failures": failures}, fh, indent=1, default=str)
    print("\nFAILURES:" if failures else "\nall GPU checks passed", *failures, sep="\n  ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out"))
