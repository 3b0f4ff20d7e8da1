"""Loss stuck: a model class whose own init fills every weight with one constant.

Every hidden unit starts identical, so they all receive the same gradient and stay identical
(symmetry is never broken); the net is one unit wide and cannot fit the curved boundary.

expect-category: loss_not_decreasing
expect-root-cause: architecture
expect-check: initialization
expect-line: nn.init.constant_(module.weight, 0.05)
fault: architecture (constant initialisation in the model's __init__)
"""
import math

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, width=48):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, width),
                                  nn.Tanh(), nn.Linear(width, 2))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.constant_(module.weight, 0.05)
                nn.init.zeros_(module.bias)

    def forward(self, x):
        return self.body(x)


def make_rings(n, generator):
    angle = torch.rand(n, generator=generator) * 2 * math.pi
    label = torch.randint(0, 2, (n,), generator=generator)
    radius = 0.5 + label.float() + 0.1 * torch.randn(n, generator=generator)
    return torch.stack([radius * angle.cos(), radius * angle.sin()], 1), label


g = torch.Generator().manual_seed(3)
features, labels = make_rings(3000, g)
net = Classifier()
opt = torch.optim.Adam(net.parameters(), lr=3e-3)
for epoch in range(5):
    order = torch.randperm(len(features), generator=g)
    for start in range(0, len(features), 100):
        batch = order[start:start + 100]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(features[batch]), labels[batch])
        loss.backward()
        opt.step()
    print(f"[{epoch}] loss {loss.item():.3f}")
