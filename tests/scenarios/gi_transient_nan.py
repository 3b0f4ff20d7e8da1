"""A NaN that does not repeat: one forward pass returns garbage once (a flipped bit on a bad GPU).

expect-category: gradient_instability
expect-root-cause: hardware
expect-check: hardware
expect-line: loss.backward()
"""
import torch
from torch import nn


class FlakyLinear(nn.Linear):
    """Stands for a faulty device: the 40th matrix product comes back corrupted."""

    calls = 0

    def forward(self, x):
        FlakyLinear.calls += 1
        out = super().forward(x)
        if FlakyLinear.calls == 40:
            out = out.clone()
            out[0, 0] = float("nan")
        return out


torch.manual_seed(21)
X = torch.randn(1024, 12)
y = (X[:, 0] > 0).long()
model = nn.Sequential(FlakyLinear(12, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(80):
    idx = torch.randint(0, 1024, (64,))
    loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
