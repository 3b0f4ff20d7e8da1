"""Loss stuck: SGD with a learning rate far too small for the problem.

expect-category: loss_not_decreasing
expect-root-cause: hyperparameter
expect-check: lr_range
expect-line: torch.optim.SGD
expect-evidence: update_ratio_median steps too small
fault: hyperparameter (lr=1e-5 for plain SGD)
"""
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(2048, 20)
y = (X[:, :5].sum(dim=1) > 0).long()
model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(4):
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        optimizer.zero_grad()
        loss = loss_fn(model(X[idx]), y[idx])
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss={loss.item():.4f}")
