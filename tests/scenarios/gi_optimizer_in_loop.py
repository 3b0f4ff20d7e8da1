"""Loss drifts up: the optimizer is re-created inside the loop, so Adam restarts every step.

expect-category: gradient_instability
expect-root-cause: training_loop
expect-check: optimizer_recreated
expect-line: torch.optim.Adam
fault: training_loop (Adam built on every step: its moments never accumulate)
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
X = torch.randn(1024, 16)
w = torch.randn(16, 1)
y = X @ w + 0.05 * torch.randn(1024, 1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
for epoch in range(6):
    for i in range(0, len(X), 32):
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        optimizer.zero_grad()
        loss = F.mse_loss(model(X[i:i + 32]), y[i:i + 32])
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss={loss.item():.4f}")
