"""Memory grows every step: predictions kept for an epoch metric still hold their autograd graph.

expect-category: memory_issue
expect-root-cause: training_loop
expect-check: graph_retention
expect-line: history.append(
fault: training_loop (second forward without no_grad, outputs appended to a list)
"""
import torch
from torch import nn

torch.manual_seed(9)
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
history = []
for step in range(60):
    x = torch.randn(256, 256)
    y = torch.randint(0, 10, (256,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss.item())  # a number, not a tensor with its graph
