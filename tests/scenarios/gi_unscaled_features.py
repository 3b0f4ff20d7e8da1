"""Loss explodes: one raw column (a distance in metres) dwarfs the others; Adam at 1e-2 diverges.

expect-category: gradient_instability
expect-root-cause: data
expect-check: feature_scaling
expect-line: X = torch.cat([rooms, age, distance_m], dim=1)
"""
import torch
from torch import nn

torch.manual_seed(16)
n = 2048
rooms = torch.randint(1, 6, (n, 1)).float()
age = 40 * torch.rand(n, 1)
distance_m = 20000 * torch.rand(n, 1)
X = torch.cat([rooms, age, distance_m], dim=1)
y = rooms - 0.02 * age - 0.0001 * distance_m
model = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(150):
    idx = torch.randint(0, n, (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
