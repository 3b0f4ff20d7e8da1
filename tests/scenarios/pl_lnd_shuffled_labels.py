"""Lightning: labels shuffled with their own permutation, so they no longer match the inputs.

expect-category: loss_not_decreasing
expect-root-cause: data
expect-check: label_alignment
expect-line: targets = targets[torch.randperm(len(targets))]
expect-backward: def training_step
"""
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
inputs = torch.randn(1600, 10)
targets = (inputs[:, :3].sum(1) > 0).long()
targets = targets[torch.randperm(len(targets))]


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, t = batch
        loss = nn.functional.cross_entropy(self(x), t)
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, t = batch
        self.log("val_acc", (self(x).argmax(1) == t).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


train = DataLoader(TensorDataset(inputs[:1280], targets[:1280]), batch_size=64, shuffle=True)
val = DataLoader(TensorDataset(inputs[1280:], targets[1280:]), batch_size=64)
trainer = pl.Trainer(max_epochs=5, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), train, val)
