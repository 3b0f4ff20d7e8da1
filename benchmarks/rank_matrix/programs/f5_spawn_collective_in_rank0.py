# FAULT: hang. After training, the test accuracy is summed across ranks with dist.all_reduce -- but
# the call sits inside `if rank == 0:`, so rank 0 waits in it for rank 1, which never calls it
# (rank 1 goes on to destroy its process group and return).
# Style: mp.spawn, functions with a config dict, TensorDataset + DistributedSampler + DataLoader,
# DDP, Adam + StepLR, an evaluate() on each rank's test shard.
import os, socket
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

CFG = {"epochs": 3, "bs": 32, "lr": 3e-3, "n_train": 1536, "n_test": 512}

def dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, 0] * 2 - x[:, 3] + x[:, 7] > 0).long()
    return TensorDataset(x, y)

def evaluate(model, loader):
    correct = torch.zeros(2)
    with torch.no_grad():
        for xb, yb in loader:
            correct[0] += (model(xb).argmax(1) == yb).sum(); correct[1] += len(yb)
    return correct

def run(rank, world, port, cfg):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train, test = dataset(cfg["n_train"], 0), dataset(cfg["n_test"], 1)
    ts = DistributedSampler(train, seed=0)
    tl = DataLoader(train, batch_size=cfg["bs"], sampler=ts)
    vl = DataLoader(test, batch_size=128, sampler=DistributedSampler(test, shuffle=False))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    for ep in range(cfg["epochs"]):
        ts.set_epoch(ep)
        for xb, yb in tl:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        sched.step()
    correct = evaluate(model.module, vl)
    if rank == 0:
        dist.all_reduce(correct)                          # <-- the fault: only rank 0 joins
        print(f"test accuracy {correct[0] / correct[1]:.3f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(2, port, CFG), nprocs=2, join=True)
