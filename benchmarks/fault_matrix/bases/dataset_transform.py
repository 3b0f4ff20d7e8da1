"""Binary classification from a Dataset subclass that normalises and augments each sample."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

rng = np.random.default_rng(3)


class Standardize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, x):
        return (x - self.mean) / self.std


class Jitter:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        return x + self.scale * np.random.randn(*x.shape).astype(np.float32)


class Compose:
    def __init__(self, steps):
        self.steps = steps

    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        return x


class SensorDataset(Dataset):
    def __init__(self, readings, targets, transform=None):
        self.readings = readings
        self.targets = targets
        self.transform = transform

    def __len__(self):
        return len(self.readings)

    def __getitem__(self, idx):
        x = self.readings[idx]
        if self.transform is not None:
            x = self.transform(x)
        return torch.as_tensor(x, dtype=torch.float32), torch.tensor(self.targets[idx],
                                                                     dtype=torch.float32)


readings = (rng.normal(size=(2000, 12)) * 40.0 + 300.0).astype(np.float32)
targets = ((readings[:, 0] - readings[:, 3] + 0.5 * readings[:, 7] - 150.0) > 0).astype(np.float32)
mean, std = readings[:1600].mean(0), readings[:1600].std(0)

train_set = SensorDataset(readings[:1600], targets[:1600],
                          transform=Compose([Standardize(mean, std), Jitter(0.05)]))
valid_set = SensorDataset(readings[1600:], targets[1600:], transform=Standardize(mean, std))
train_dl = DataLoader(train_set, batch_size=50, shuffle=True)
valid_dl = DataLoader(valid_set, batch_size=400)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 48)
        self.bn = nn.BatchNorm1d(48)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(48, 1)

    def forward(self, x):
        x = F.relu(self.bn(self.fc1(x)))
        x = self.drop(x)
        return self.fc2(x).squeeze(-1)


clf = Classifier()
optim = torch.optim.AdamW(clf.parameters(), lr=3e-3, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
bce = nn.BCEWithLogitsLoss()

for epoch in range(8):
    clf.train()
    for xs, ys in train_dl:
        optim.zero_grad()
        loss = bce(clf(xs), ys)
        loss.backward()
        optim.step()
    sched.step()
    clf.eval()
    hits, seen = 0, 0
    with torch.no_grad():
        for xs, ys in valid_dl:
            hits += ((clf(xs) > 0).float() == ys).sum().item()
            seen += len(ys)
    print("epoch", epoch, "train loss", round(loss.item(), 4), "val accuracy", round(hits / seen, 4))
