"""Overfitting in regression; validation loss is computed but never printed (seen under no_grad).

expect-category: overfitting
expect-root-cause: data
expect-check: data_volume
expect-line: model = nn.Sequential
fault: architecture/data (high-degree polynomial features on 40 points)
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(4)
def make(n):
    x = torch.rand(n, 1) * 2 - 1
    y = torch.sin(3 * x) + 0.3 * torch.randn(n, 1)
    return torch.cat([x ** k for k in range(1, 13)], dim=1), y
X, y = make(30)
Xv, yv = make(400)
model = nn.Sequential(nn.Linear(12, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
train = DataLoader(TensorDataset(X, y), batch_size=10, shuffle=True)
val = DataLoader(TensorDataset(Xv, yv), batch_size=100)
criterion = nn.MSELoss()
for epoch in range(40):
    model.train()
    for xb, yb in train:
        opt.zero_grad()
        criterion(model(xb), yb).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        total = sum(criterion(model(xb), yb).item() * len(xb) for xb, yb in val) / len(Xv)
