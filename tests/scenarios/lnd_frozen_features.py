"""Loss held up: the feature extractor is frozen straight after it is built (random weights, not
pretrained), so only the small head trains and the loss settles far above what the net can do.

expect-category: loss_not_decreasing
expect-root-cause: architecture
expect-check: frozen_parameters
expect-line: net.features.requires_grad_(False)
fault: architecture (a randomly initialised body frozen)
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(4)
X = torch.randn(3000, 12)
y = ((X[:, 0] * X[:, 1] > 0) ^ (X[:, 2] > 0.5)).long() + (X[:, 3] > 1).long()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU())
        self.head = nn.Linear(96, 3)

    def forward(self, x):
        return self.head(self.features(x))


net = Net()
net.features.requires_grad_(False)
loader = DataLoader(TensorDataset(X[:2500], y[:2500]), batch_size=50, shuffle=True)
opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=3e-3)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(6):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(net(xb), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (net(X[2500:]).argmax(1) == y[2500:]).float().mean().item()
    print(f"epoch {epoch} loss {loss.item():.4f} held-out acc {acc:.3f}")
