# FAULT: desync. The learning rate is "scaled" by the rank (lr * (1 + rank)), so after the first
# update the DDP replicas hold different weights even though their gradients are averaged.
# Style: torchrun, config dict + functions, DistributedSampler + DataLoader, SGD + ExponentialLR.
import os
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

config = {"lr": 0.02, "batch_size": 32, "epochs": 3, "gamma": 0.9, "hidden": 32}

def get_loader(cfg):
    g = torch.Generator().manual_seed(42)
    x = torch.randn(1600, 10, generator=g)
    y = x @ torch.randn(10, 2, generator=g) + 0.1 * torch.randn(1600, 2, generator=g)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds)
    return DataLoader(ds, batch_size=cfg["batch_size"], sampler=sampler), sampler

def get_model(cfg):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, cfg["hidden"]), nn.ReLU(), nn.Linear(cfg["hidden"], 2))

def main(cfg):
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    loader, sampler = get_loader(cfg)
    model = DDP(get_model(cfg))
    lr = cfg["lr"] * (1 + rank)                       # <-- the fault
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg["gamma"])
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
        sched.step()
        print(f"rank {rank} epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main(config)
