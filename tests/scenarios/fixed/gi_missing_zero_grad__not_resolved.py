"""Loss oscillates and grows: gradients are never cleared, so every step applies their running sum.

expect-category: gradient_instability
expect-root-cause: training_loop
expect-check: missing_zero_grad
expect-line: loss.backward()
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(20)
X = torch.randn(4096, 10)
y = X @ torch.randn(10, 1) + 0.1 * torch.randn(4096, 1)
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
optimizer.zero_grad()  # the wrong fix: cleared once, before training, never inside the loop
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss={loss.item():.4f}")
