# HEALTHY. Style: mp.spawn, a one-time data preparation on rank 0 (generate + "clean" + save a .pt
# file, ~1.5 s) while rank 1 waits at dist.barrier(); then every rank loads the file. DDP, SGD +
# OneCycleLR, DistributedSampler + DataLoader with one worker process.
import tempfile
import os, sys, socket, time
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

DATA = os.path.join(tempfile.gettempdir(), "md_rank_matrix_h5_data.pt")

def prepare(path):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1200, 20, generator=g)
    time.sleep(1.0)                                   # pretend: download / decode
    x = (x - x.mean(0)) / x.std(0)                    # normalise
    y = (x[:, :5].sum(1) > 0).long()
    torch.save({"x": x, "y": y}, path + ".tmp"); os.replace(path + ".tmp", path)

def main(rank, world, port, epochs):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group(backend="gloo", init_method="env://", rank=rank, world_size=world)
    if rank == 0:
        prepare(DATA)
    dist.barrier()
    blob = torch.load(DATA)
    ds = TensorDataset(blob["x"], blob["y"])
    sampler = DistributedSampler(ds, shuffle=True, seed=11)
    dl = DataLoader(ds, batch_size=40, sampler=sampler, num_workers=1, persistent_workers=True)
    torch.manual_seed(5)
    model = DDP(nn.Sequential(nn.Linear(20, 40), nn.GELU(), nn.Linear(40, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=epochs * len(dl))
    for ep in range(epochs):
        sampler.set_epoch(ep)
        for xb, yb in dl:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if rank == 0:
            print(f"[ep {ep}] loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(main, args=(2, port, epochs), nprocs=2)
