"""Healthy: a Dataset that caches each decoded sample the first time it is read. Memory grows
through the first epoch (the cache filling) and is flat in the second, where a step budget
stops the run: a steady rise over most of the run, but not a leak.

expect-category: healthy
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(4)
N, D = 12000, 3072
W = torch.randn(D, 5)


class Decoded(Dataset):
    """Decodes (here: generates) a sample on first access and keeps it."""

    def __init__(self):
        self.cache = {}

    def __len__(self):
        return N

    def __getitem__(self, i):
        if i not in self.cache:
            g = torch.Generator().manual_seed(i)
            x = torch.randn(D, generator=g)
            self.cache[i] = (x, int((x @ W).argmax()))
        return self.cache[i]


loader = DataLoader(Decoded(), batch_size=100, shuffle=True)
model = nn.Sequential(nn.Linear(D, 512), nn.ReLU(), nn.Linear(512, 5))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
step, epoch = 0, 0
while step < 170:  # a step budget, not whole epochs: the run stops early in the second epoch
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        step += 1
        if step == 170:
            break
    print(f"epoch {epoch}: step={step} loss={loss.item():.4f}")
    epoch += 1
