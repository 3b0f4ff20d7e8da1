# FAULT: hang (variant with an epoch-end barrier). Same uneven split without drop_last: rank 1 (16 batches)
# reaches the epoch-end dist.barrier() while rank 0 (17 batches) is still in its 17th backward,
# waiting in DDP's all-reduce: the two ranks wait in different collectives until the timeout.
# Style: torchrun, top-level script with a train_one_epoch() helper, TensorDataset + Subset +
# DataLoader(shuffle=True), AdamW.
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, Subset

def train_one_epoch(model, loader, opt, loss_fn):
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
    return total / len(loader)

if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1025, 12, generator=g); Y = (X[:, 0] - X[:, 5] > 0).long()
    shard = Subset(TensorDataset(X, Y), range(rank, len(X), world))
    loader = DataLoader(shard, batch_size=32, shuffle=True)     # <-- no drop_last: 17 vs 16 batches
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(3):
        avg = train_one_epoch(model, loader, opt, nn.CrossEntropyLoss())
        print(f"rank {rank} epoch {epoch} avg loss {avg:.4f}", flush=True)
        dist.barrier()                                             # everyone finishes the epoch
    dist.destroy_process_group()
