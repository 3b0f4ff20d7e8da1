# HEALTHY. Style: Trainer class, torch.multiprocessing.spawn, DDP, DistributedSampler + DataLoader
# over a TensorDataset, Adam + StepLR, rank-0-only validation (~1.2 s) each epoch, then dist.barrier().
import os, socket, time
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def make_data(n=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(123))
    y = (x @ w).argmax(1)
    return TensorDataset(x, y)

class Trainer:
    def __init__(self, rank, world, epochs=4, bs=32):
        self.rank, self.world, self.epochs = rank, world, epochs
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        ds = make_data()
        self.sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        self.loader = DataLoader(ds, batch_size=bs, sampler=self.sampler)
        self.val = make_data(512, seed=1)
        self.loss_fn = nn.CrossEntropyLoss()

    def validate(self):
        self.model.eval()
        with torch.no_grad():
            x, y = self.val.tensors
            acc = 0.0
            for _ in range(40):  # slow-ish "full" validation, about a second
                acc = (self.model.module(x).argmax(1) == y).float().mean().item()
                time.sleep(0.03)
        self.model.train()
        return acc

    def fit(self):
        for ep in range(self.epochs):
            self.sampler.set_epoch(ep)
            for x, y in self.loader:
                self.opt.zero_grad()
                loss = self.loss_fn(self.model(x), y)
                loss.backward()
                self.opt.step()
            self.sched.step()
            if self.rank == 0:
                print(f"epoch {ep} loss {loss.item():.4f} val_acc {self.validate():.3f}", flush=True)
            dist.barrier()

def worker(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    Trainer(rank, world).fit()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, free_port()), nprocs=2, join=True)
