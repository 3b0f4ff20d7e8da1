"""NaN: SGD with a learning rate far too high diverges to inf/NaN within a few steps.

expect-category: gradient_instability
expect-root-cause: hyperparameter
expect-check: lr_range
expect-line: torch.optim.SGD
"""
import torch
from torch import nn

torch.manual_seed(5)
X = torch.randn(1024, 6)
y = X @ torch.randn(6, 1)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1.0)
for step in range(200):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0:
        print(f"step {step} loss={loss.item():.4g}")
