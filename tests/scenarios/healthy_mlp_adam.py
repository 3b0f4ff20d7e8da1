"""Healthy: an MLP learns a separable problem; loss and validation loss both fall.

expect-category: healthy
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(14)
X = torch.randn(2048, 10)
y = (X[:, 0] + X[:, 1] > 0).long()
train = DataLoader(TensorDataset(X[:1536], y[:1536]), batch_size=64, shuffle=True)
Xv, yv = X[1536:], y[1536:]
model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(5):
    for xb, yb in train:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        out = model(Xv)
        val_loss = nn.functional.cross_entropy(out, yv).item()
        val_acc = (out.argmax(1) == yv).float().mean().item()
    print(f"epoch {epoch}: train_loss={loss.item():.4f} val_loss={val_loss:.4f} val_acc={val_acc:.3f}")
