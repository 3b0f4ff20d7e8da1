"""Two interleaved half-moons, a LightningModule, a Lightning Trainer with validation."""
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(7)
angle = rng.uniform(0, np.pi, 2000)
side = rng.integers(0, 2, 2000)
points = np.stack([np.cos(angle) + side, np.sin(angle) * (1 - 2 * side) + 0.4 * side], 1)
points = points + rng.normal(0, 0.15, points.shape)
X = torch.tensor(points, dtype=torch.float32)
y = torch.tensor(side, dtype=torch.long)


class MoonModule(pl.LightningModule):
    def __init__(self, hidden=48, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.layers = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                    nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x):
        return self.layers(x)

    def training_step(self, batch, batch_idx):
        x, t = batch
        logits = self(x)
        loss = F.cross_entropy(logits, t)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, t = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, t))
        self.log("val_acc", (logits.argmax(1) == t).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


train_loader = DataLoader(TensorDataset(X[:1600], y[:1600]), batch_size=64, shuffle=True)
val_loader = DataLoader(TensorDataset(X[1600:], y[1600:]), batch_size=200)
trainer = pl.Trainer(max_epochs=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(MoonModule(), train_loader, val_loader)
print({k: round(float(v), 4) for k, v in trainer.callback_metrics.items()})
