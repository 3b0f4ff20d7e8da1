"""Worker processes that cost more than they save: timed in the step, tested by experiment.

A small in-memory dataset loaded through more worker processes than the machine has cores,
started again at every epoch: the iterator's start counts as the loop's wait for data, and
``dataloader_throughput`` loads the same batches in the training process to show the workers
are the cost, located where ``num_workers`` is set (``data``: a setting the code changes).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
WORKERS = (os.cpu_count() or 1) + 2  # <workers>


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def train():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        num_workers=WORKERS)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _epoch in range(4):
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()


def test_workers_started_every_epoch_are_waited_for_and_found_at_num_workers(tmp_path):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train()
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    [f] = [f for f in run_probes(ctx, ["dataloader_throughput"]).findings]
    assert (f.root_cause, f.confirmed, f.evidence["num_workers"]) == \
        ("data", True, WORKERS), f
    assert f.evidence["in_process_ms"] < 0.5 * (f.evidence["load_ms"] + f.evidence["restart_ms"])
    assert f.location["line"] == line_of("workers"), f.location  # (where the value is set)


def test_starting_a_training_loaders_iterator_is_waiting_for_data(tmp_path):
    """Whatever starting the iterator costs (worker processes; here a pause put there) is
    the loop's wait for data, on the first step of each pass."""
    import time

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16)
    started = loader._get_iterator

    def slow_start():
        time.sleep(0.2)
        return started()

    loader._get_iterator = slow_start
    net = nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path):
        for _epoch in range(2):
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(net(xb), yb).backward()
                opt.step()
    steps = Run.load(path).steps
    assert [s["dw"] >= 0.2 for s in steps] == [True, False, False, False] * 2, \
        [s["dw"] for s in steps]
