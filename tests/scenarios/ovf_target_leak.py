"""Train loss collapses, validation loss climbs: a column derived from the label leaked into training.

expect-category: overfitting
expect-root-cause: data
expect-check: target_copy|leakage
expect-line: X, y = make(1200, leak=True)
"""
import torch
from torch import nn

torch.manual_seed(18)
def make(n, leak):
    X = torch.randn(n, 6)
    y = ((X[:, 0] - X[:, 1] + 1.5 * torch.randn(n)) > 0).long()
    # "customer_churned_flag" was computed after the outcome; at prediction time it is unknown
    flag = y.float() if leak else torch.randint(0, 2, (n,)).float()
    return torch.cat([X, flag[:, None]], dim=1), y
X, y = make(1200, leak=True)
Xv, yv = make(600, leak=False)
model = nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
for epoch in range(12):
    for i in range(0, len(X), 100):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 100]), y[i:i + 100])
        loss.backward()
        opt.step()
    with torch.no_grad():
        val_loss = nn.functional.cross_entropy(model(Xv), yv)
    print(f"epoch {epoch}: train_loss={loss.item():.4f} val_loss={val_loss.item():.4f}")
