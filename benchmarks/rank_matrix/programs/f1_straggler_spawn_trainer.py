# FAULT: straggler. Rank 1 (the "monitoring" rank) computes per-sample gradient-free statistics in a
# Python loop after every step (~20 ms); rank 0 waits for it inside DDP's all-reduce each step.
# Style: a Trainer class with hooks, mp.spawn, DistributedSampler + DataLoader, AdamW + LambdaLR warmup.
import os, socket, math
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

class Trainer:
    def __init__(self, rank, world):
        self.rank = rank
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1536, 16, generator=g); y = (x[:, :4].sum(1) > 0).long()
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=0)
        self.loader = DataLoader(ds, batch_size=32, sampler=self.sampler)
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 10))
        self.stats = []

    def on_step_end(self, x, out):
        if self.rank == 1:                       # <-- the fault: only rank 1 does this, every step
            row = []
            for i in range(x.shape[0]):
                xi = x[i].tolist()
                row.append(sum(v * v for v in xi) ** 0.5)
                for _ in range(200):
                    math.sqrt(sum(abs(v) for v in xi))
            self.stats.append(sum(row) / len(row))

    def train(self, epochs=3):
        for ep in range(epochs):
            self.sampler.set_epoch(ep)
            for x, y in self.loader:
                out = self.model(x)
                loss = nn.functional.cross_entropy(out, y)
                self.opt.zero_grad(); loss.backward(); self.opt.step(); self.sched.step()
                self.on_step_end(x, out)
            if self.rank == 0:
                print(f"ep {ep} loss {loss.item():.4f}", flush=True)

def run(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    Trainer(rank, world).train()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(2, port), nprocs=2)
