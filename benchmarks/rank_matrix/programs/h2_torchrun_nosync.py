# HEALTHY. Style: launched by torchrun, plain functions driven by a config dict, gradient
# accumulation with model.no_sync() (all-reduce only on the last micro-batch), AdamW + cosine schedule,
# hand-made batches (a per-rank slice of one tensor, fixed shuffle per epoch).
import os, contextlib
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = dict(n=2048, d_in=12, hidden=48, micro_bs=16, accum=4, epochs=5, lr=2e-3, wd=1e-2, seed=7)

def build_model(cfg):
    torch.manual_seed(cfg["seed"])
    return nn.Sequential(nn.Linear(cfg["d_in"], cfg["hidden"]), nn.Tanh(), nn.Linear(cfg["hidden"], 1))

def make_data(cfg):
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(cfg["n"], cfg["d_in"], generator=g)
    y = torch.sin(x[:, :3].sum(1, keepdim=True)) + 0.05 * torch.randn(cfg["n"], 1, generator=g)
    return x, y

def batches(x, y, cfg, rank, world, epoch):
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(cfg["seed"] + epoch))
    mine = perm[rank::world]
    for i in range(0, len(mine) - cfg["micro_bs"] + 1, cfg["micro_bs"]):
        idx = mine[i:i + cfg["micro_bs"]]
        yield x[idx], y[idx]

def train(cfg):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = DDP(build_model(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
    x, y = make_data(cfg)
    per_epoch = (len(x) // world // cfg["micro_bs"]) // cfg["accum"]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=per_epoch * cfg["epochs"])
    loss_fn = nn.MSELoss()
    for ep in range(cfg["epochs"]):
        for i, (xb, yb) in enumerate(batches(x, y, cfg, rank, world, ep)):
            last = (i + 1) % cfg["accum"] == 0
            ctx = contextlib.nullcontext() if last else model.no_sync()
            with ctx:
                loss = loss_fn(model(xb), yb) / cfg["accum"]
                loss.backward()
            if last:
                opt.step(); sched.step(); opt.zero_grad()
        if rank == 0:
            print(f"epoch {ep} loss {loss.item() * cfg['accum']:.4f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    train(CFG)
