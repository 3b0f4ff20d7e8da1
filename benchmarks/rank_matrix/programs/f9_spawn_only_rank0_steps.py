# FAULT: desync. The optimizer step was moved into the "main process" block together with the
# logging, so only rank 0 ever updates its weights; rank 1 keeps its initial weights while still
# contributing gradients (computed at stale weights) to DDP's all-reduce.
# Style: mp.spawn, helper functions is_main()/log(), DDP, DataLoader + DistributedSampler over a
# TensorDataset, RMSprop.
import os, socket
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

def is_main():
    return dist.get_rank() == 0

def log(step, loss):
    if step % 10 == 0:
        print(f"step {step} loss {loss:.4f}", flush=True)

def train(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1920, 12, generator=g); y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long()
    ds = TensorDataset(x, y); sampler = DistributedSampler(ds, seed=0)
    dl = DataLoader(ds, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 2)))
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    step = 0
    for ep in range(2):
        sampler.set_epoch(ep)
        for xb, yb in dl:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            if is_main():                                 # <-- the fault: step inside the main-only block
                opt.step()
                log(step, loss.item())
            step += 1
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(train, args=(2, port), nprocs=2)
