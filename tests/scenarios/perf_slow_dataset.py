"""Slow steps: the Dataset decodes every sample on the fly in Python; the model waits for data.

expect-category: performance_issue
expect-root-cause: data
expect-check: dataloader_throughput
expect-line: def __getitem__|time.sleep(
fault: data pipeline (per-sample work in __getitem__, num_workers=0)
"""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(10)
        self.raw = torch.randn(n, 32, generator=g)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        time.sleep(0.002)  # stands for JPEG decoding / augmentation
        x = self.raw[i]
        return x, int(x[0] > 0)


model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.Adam(model.parameters(), lr=3e-2)
loader = DataLoader(Decoded(640), batch_size=32, shuffle=True)
for epoch in range(1):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss={loss.item():.3f}")
