"""Slow steps: a collate function that builds tensors element by element in Python.

expect-category: performance_issue
expect-root-cause: data
expect-check: dataloader_throughput
expect-line: def collate|xs[i, j] = v
fault: data pipeline (pure-Python collate)
"""
import torch
from torch import nn
from torch.utils.data import DataLoader

torch.manual_seed(11)
rows = [[float(v) for v in torch.randn(256)] for _ in range(1024)]
labels = [int(r[0] > 0) for r in rows]


def collate(batch):
    xs = torch.zeros(len(batch), 256)
    for i, (row, _) in enumerate(batch):
        for j, v in enumerate(row):
            xs[i, j] = v
    return xs, torch.tensor([label for _, label in batch])


model = nn.Sequential(nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(list(zip(rows, labels)), batch_size=64, shuffle=True, collate_fn=collate)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
