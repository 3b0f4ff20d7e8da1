"""Loss stuck at the constant predictor: labels carry no information about the inputs.

expect-category: loss_not_decreasing
expect-root-cause: data
expect-check: label_alignment
expect-line: y = torch.randint(0, 4, (1536,))
fault: data (labels drawn independently of the images)
"""
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter
import tempfile

torch.manual_seed(2)
X = torch.randn(1536, 1, 12, 12)
y = torch.randint(0, 4, (1536,))
model = nn.Sequential(
    nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 5 * 5, 4))
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
writer = SummaryWriter(tempfile.mkdtemp())
step = 0
for epoch in range(2):
    for i in range(0, len(X), 32):
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        writer.add_scalar("train/loss", loss.item(), step)
        step += 1
writer.close()
