"""Lightning: a few training rows hold NaN features (missing values never imputed).

expect-category: gradient_instability
expect-root-cause: data
expect-check: nonfinite_inputs
expect-line: features[::61] = float("nan")
expect-backward: def training_step
"""
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(1200, 8)
labels = (features[:, 0] - features[:, 3] > 0).long()
features[::61] = float("nan")


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, t = batch
        loss = nn.functional.cross_entropy(self(x), t)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


train = DataLoader(TensorDataset(features, labels), batch_size=32, shuffle=True)
pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
           enable_progress_bar=False, enable_model_summary=False).fit(Classifier(), train)
