"""Out of memory: a batch built for the whole dataset at once cannot be allocated.

expect-category: memory_issue
expect-root-cause: hyperparameter
expect-check: batch_memory
expect-line: torch.randn(batch_size
fault: hyperparameter (batch size far beyond memory)
"""
import torch
from torch import nn

torch.manual_seed(8)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters())
batch_size = 32
for step in range(30):
    if step == 20:
        batch_size = 2 ** 40  # "use the whole dataset as one batch"
    x = torch.randn(batch_size, 64)
    y = x[:, :10].argmax(dim=1)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
