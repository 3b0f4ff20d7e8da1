"""Healthy: a small CNN regresses the mean brightness of images; TensorBoard logging.

expect-category: healthy
"""
import tempfile

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

torch.manual_seed(15)
X = torch.rand(1024, 1, 16, 16) * torch.rand(1024, 1, 1, 1) * 2
y = X.mean(dim=(1, 2, 3)).unsqueeze(1) * 4
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                      nn.Flatten(), nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
writer = SummaryWriter(tempfile.mkdtemp())
step = 0
for epoch in range(4):
    for i in range(0, 896, 32):
        loss = nn.functional.mse_loss(model(X[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    with torch.no_grad():
        writer.add_scalars("loss", {"train": loss.item(),
                                    "val": nn.functional.mse_loss(model(X[896:]), y[896:]).item()},
                           step)
writer.close()
