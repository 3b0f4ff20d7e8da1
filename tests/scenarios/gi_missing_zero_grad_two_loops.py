"""Two training loops, both without zero_grad(); only the second one runs (no --pretrain flag).

The diagnosis must point at the loop that ran, not at the first one in the file.

expect-category: gradient_instability
expect-root-cause: training_loop
expect-check: missing_zero_grad
expect-line: criterion(net(xb), yb).backward()
"""
import sys

import torch
from torch import nn

torch.manual_seed(3)
X = torch.randn(3000, 16)
y = (X[:, :4].sum(1) > 0).long() + (X[:, 4] > 1).long()
net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
criterion = nn.CrossEntropyLoss()


def pretrain(encoder, epochs=3):
    """Reconstruction warm-up, used with --pretrain only."""
    opt = torch.optim.SGD(encoder.parameters(), lr=0.01)
    for _ in range(epochs):
        for i in range(0, len(X), 100):
            recon = encoder(X[i:i + 100])
            nn.functional.mse_loss(recon, X[i:i + 100, :3]).backward()
            opt.step()


if "--pretrain" in sys.argv:
    pretrain(net)
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in range(3):
    for i in range(0, len(X), 50):
        xb, yb = X[i:i + 50], y[i:i + 50]
        criterion(net(xb), yb).backward()
        optimizer.step()
    with torch.no_grad():
        acc = (net(X).argmax(1) == y).float().mean().item()
    print(f"epoch {epoch} accuracy={acc:.3f}")
