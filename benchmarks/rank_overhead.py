"""Per-step overhead of the capture on each rank of a 2-rank DDP job (gloo, CPU), against one process.

Two ranks (``torch.multiprocessing.spawn``, one process group) train the same MLP wrapped in
``DistributedDataParallel``. Each rank runs rounds of three modes in lockstep: bare, under
``model_debugger.capture()`` (a record streamed to a file; the group exists, so the rank's
extra fields are on: collective timing, forward time, checksums every 10 steps, the stall
watch), bare again, rotating which comes first. A mode's first ``SKIP`` steps (warm-up and the
capture's first 32 steps, when it keeps batches for Isolate) are left out; the rest is the
steady state. Then the same is done in one process on the same model without DDP: the
single-process overhead in the same run, on the same machine.

Printed: per rank, the median steady step bare and captured and their ratio; ``paired`` (the
median over rounds of that round's captured/bare); ``A/A`` (bare again / bare: the noise floor of
this run); and the same for the single process. The target: each rank's ratio no worse than the
single process's (beyond the A/A noise).

    python benchmarks/rank_overhead.py            # 20 rounds, 60 steps per mode
    python benchmarks/rank_overhead.py --quick    # 4 rounds
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_debugger  # noqa: E402

STEPS = 60
SKIP = 44  # warm-up and the capture's first 32 steps


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def _loop(model, opt, X, y, steps: int) -> list[float]:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        j = (i * 64) % len(X)
        loss = nn.functional.cross_entropy(model(X[j:j + 64]), y[j:j + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[SKIP:]


def _rounds(model, opt, X, y, rounds: int, folder: str) -> dict:
    """Rounds of bare / captured / bare (rotated); steady medians per mode and per round."""
    modes = ("bare", "captured", "bare2")
    per_round = []
    pooled = {m: [] for m in modes}
    for r in range(rounds):
        order = modes[r % 3:] + modes[:r % 3]
        medians = {}
        for mode in order:
            if mode == "captured":
                with model_debugger.capture(os.path.join(folder, f"r{r}.jsonl")):
                    t = _loop(model, opt, X, y, STEPS)
            else:
                t = _loop(model, opt, X, y, STEPS)
            pooled[mode] += t
            medians[mode] = statistics.median(t)
        per_round.append(medians)
    bare = statistics.median(pooled["bare"] + pooled["bare2"])
    return {"bare": bare, "captured": statistics.median(pooled["captured"]),
            "ratio": statistics.median(pooled["captured"]) / bare,
            "paired": statistics.median(m["captured"] / m["bare"] for m in per_round),
            "aa": statistics.median(m["bare2"] / m["bare"] for m in per_round)}


def _data(rank: int):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(64 * 16, 784, generator=g), torch.randint(0, 10, (64 * 16,), generator=g)


def _rank(rank: int, world: int, port: int, rounds: int, folder: str, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    X, y = _data(rank)
    res = _rounds(model, opt, X, y, rounds, os.path.join(folder, f"rank{rank}"))
    out.put((rank, res))
    dist.barrier()
    dist.destroy_process_group()


def _single(rounds: int, folder: str) -> dict:
    torch.set_num_threads(1)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    X, y = _data(0)
    return _rounds(model, opt, X, y, rounds, os.path.join(folder, "single"))


def _line(name: str, r: dict) -> str:
    return (f"{name:<8} bare {r['bare'] * 1000:7.3f} ms  captured {r['captured'] * 1000:7.3f} ms"
            f"  ratio {r['ratio']:.3f}  paired {r['paired']:.3f}  A/A {r['aa']:.3f}")


def main(argv=None) -> int:
    """Run both measurements and print their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="4 rounds")
    ns = parser.parse_args(argv)
    rounds = 4 if ns.quick else ns.rounds
    with tempfile.TemporaryDirectory() as folder:
        for sub in ("rank0", "rank1", "single"):
            os.makedirs(os.path.join(folder, sub))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        out = ctx.SimpleQueue()
        mp.spawn(_rank, args=(2, port, rounds, folder, out), nprocs=2)
        results = dict(out.get() for _ in range(2))
        single = _single(rounds, folder)
    print(f"capture overhead, {rounds} rounds x {STEPS - SKIP} steady steps per mode "
          f"(MLP 784-512-256-10, batch 64, Adam; DDP on gloo, 1 thread per process)")
    for rank in sorted(results):
        print(_line(f"rank {rank}", results[rank]))
    print(_line("single", single))
    worst = max(r["ratio"] for r in results.values())
    print(f"worst rank ratio / single-process ratio: {worst / single['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
