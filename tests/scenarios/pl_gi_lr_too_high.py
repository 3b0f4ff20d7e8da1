"""Lightning: SGD with a learning rate far too high for the target scale blows the loss up.

expect-category: gradient_instability
expect-root-cause: hyperparameter
expect-check: lr_range|overfit_small_batch|gradient_flow|dead_units
expect-line: torch.optim.SGD
expect-backward: def training_step
"""
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(1024, 6)
y = X @ torch.randn(6, 1) * 3


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, t = batch
        loss = nn.functional.mse_loss(self(x), t)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regressor(), loader)
