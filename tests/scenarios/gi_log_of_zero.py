"""NaN from the forward pass: a hand-written log-probability layer takes log(0).

expect-category: gradient_instability
expect-root-cause: architecture
expect-check: gradient_flow
expect-line: def forward(self, x):  # log-probabilities
fault: architecture (log of a probability that underflows to 0)
"""
import torch
from torch import nn


class LogProb(nn.Module):
    def forward(self, x):  # log-probabilities
        return torch.log(torch.softmax(x * 50.0, dim=1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
        self.logprob = LogProb()

    def forward(self, x):
        return self.logprob(self.body(x))


torch.manual_seed(6)
X = torch.randn(2048, 10) * 3
y = torch.randint(0, 3, (2048,))
net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for step in range(150):
    idx = torch.randint(0, len(X), (128,))
    out = net(X[idx])
    loss = nn.functional.nll_loss(out, y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
