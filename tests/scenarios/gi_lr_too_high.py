"""NaN: SGD with a high learning rate on unscaled features diverges to inf/NaN.

expect-category: gradient_instability
fault: hyperparameter (lr=0.05 with features in the thousands)
"""
import torch
from torch import nn

torch.manual_seed(5)
X = torch.randn(1024, 6) * torch.tensor([1.0, 10.0, 100.0, 1000.0, 1.0, 5.0])
y = X @ torch.randn(6, 1) * 0.01
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(200):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0:
        print(f"step {step} loss={loss.item():.4g}")
