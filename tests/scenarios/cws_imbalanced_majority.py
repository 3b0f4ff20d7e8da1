"""Loss falls, accuracy never leaves the majority rate: the model predicts "negative" always.

expect-category: convergence_to_wrong_solution
expect-root-cause: data
expect-check: class_imbalance
expect-line: criterion = nn.BCEWithLogitsLoss()
fault: data (95/5 class imbalance, no class weights)
"""
import torch
from torch import nn

torch.manual_seed(12)
n = 4000
y = (torch.rand(n) < 0.05).float()
X = torch.randn(n, 20) + 0.15 * y[:, None]
Xv, yv = X[3000:], y[3000:]
X, y = X[:3000], y[:3000]
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.BCEWithLogitsLoss()
for epoch in range(5):
    for i in range(0, len(X), 100):
        opt.zero_grad()
        loss = criterion(model(X[i:i + 100]).squeeze(1), y[i:i + 100])
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = ((model(Xv).squeeze(1) > 0).float() == yv).float().mean().item()
    print(f"epoch {epoch} | train_loss: {loss.item():.4f} | val_acc: {acc:.4f}")
