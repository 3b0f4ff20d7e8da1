# FAULT: exploding learning rate. The "warmup" LambdaLR multiplies the rate by 1.15 every step and
# is never capped (the min(1, ...) was forgotten): from 0.01 it passes 1.0 around step 33 and the
# loss diverges to inf/NaN on every rank alike.
# Style: mp.spawn, DDP, TensorDataset + DistributedSampler + DataLoader, SGD, regression.
import os, socket
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

def worker(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2560, 8, generator=g)
    y = 3 * x[:, :1] - 2 * x[:, 1:2] + x[:, 2:3] * x[:, 3:4]
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.15 ** s)   # <-- the fault
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step(); warmup.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4g} lr {warmup.get_last_lr()[0]:.3g}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(2, port), nprocs=2)
