"""Accuracy looks fine, the rare class is never found: 3% positives, an unweighted loss.

expect-category: convergence_to_wrong_solution
expect-root-cause: data
expect-check: minority_ignored
expect-line: criterion = nn.BCEWithLogitsLoss()
fault: data (97/3 class imbalance, the loss not weighted)
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
torch.set_num_threads(1)
n = 6000
y = (torch.rand(n) < 0.03).float()
X = torch.randn(n, 12)
X[:, :3] += 1.2 * y[:, None]
train = DataLoader(TensorDataset(X[:4500], y[:4500]), batch_size=64, shuffle=True)
Xv, yv = X[4500:], y[4500:]
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = nn.BCEWithLogitsLoss()
for epoch in range(6):
    for xb, yb in train:
        opt.zero_grad()
        loss = criterion(model(xb).squeeze(1), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = (model(Xv).squeeze(1) > 0).float()
        acc = (pred == yv).float().mean().item()
    print(f"epoch {epoch} loss {loss.item():.4f} val_acc {acc:.4f}")
