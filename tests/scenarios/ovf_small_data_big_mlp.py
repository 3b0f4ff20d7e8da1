"""Overfitting: a wide MLP memorises 64 noisy samples; validation loss turns up.

expect-category: overfitting
expect-root-cause: data
expect-check: data_volume
expect-line: model = nn.Sequential
fault: data (too little data for the capacity), no regularisation
"""
import torch
from torch import nn

torch.manual_seed(3)
def make(n):
    X = torch.randn(n, 30)
    y = ((X[:, 0] + 0.8 * torch.randn(n)) > 0).long()
    return X, y
X, y = make(64)
Xv, yv = make(512)
model = nn.Sequential(nn.Linear(30, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(40):
    for i in range(0, 64, 16):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
    with torch.no_grad():
        val_logits = model(Xv)
        val_loss = nn.functional.cross_entropy(val_logits, yv).item()
        val_acc = (val_logits.argmax(1) == yv).float().mean().item()
    print(f"epoch {epoch}: train_loss={loss.item():.4f} val_loss={val_loss:.4f} val_acc={val_acc:.3f}")
