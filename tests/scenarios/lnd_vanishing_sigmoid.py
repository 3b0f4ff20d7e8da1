"""Vanishing gradients: a 12-layer sigmoid MLP; early layers get almost no gradient.

The loss stays at the constant predictor's: that symptom is the category, and the vanishing
gradients that explain it the secondary one.

expect-category: loss_not_decreasing
expect-secondary: gradient_instability
expect-root-cause: architecture
expect-check: gradient_flow
expect-line: layers += [nn.Linear(32, 32), nn.Sigmoid()]|layers = [nn.Linear(16, 32), nn.Sigmoid()]
fault: architecture (deep sigmoid stack, default init)
"""
import torch
from torch import nn

torch.manual_seed(7)
X = torch.randn(2048, 16)
y = (X[:, 0] * X[:, 1] > 0).long()
layers = [nn.Linear(16, 32), nn.Sigmoid()]
for _ in range(11):
    layers += [nn.Linear(32, 32), nn.Sigmoid()]
model = nn.Sequential(*layers, nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    for i in range(0, len(X), 64):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 64]), y[i:i + 64])
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss: {loss.item():.4f}")
