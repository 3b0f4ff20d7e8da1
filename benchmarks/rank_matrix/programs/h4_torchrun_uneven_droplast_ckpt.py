# HEALTHY. Style: torchrun, module-level script, strided manual sharding of a 1001-sample TensorDataset
# (rank 0 holds 501 samples, rank 1 holds 500) made even by DataLoader(drop_last=True), DDP, SGD +
# MultiStepLR, rank 0 saves a checkpoint at the end of every epoch (others wait at a barrier).
import tempfile
import os, argparse
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, Subset

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--ckpt-dir", default=os.path.join(tempfile.gettempdir(), "md_rank_matrix_ckpt_h4"))
args = ap.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)

g = torch.Generator().manual_seed(0)
X = torch.randn(1001, 8, generator=g)
Y = (X[:, 0] + 0.5 * X[:, 1] - X[:, 2] > 0).long()
full = TensorDataset(X, Y)
shard = Subset(full, list(range(rank, len(full), world)))   # 501 vs 500 samples
loader = DataLoader(shard, batch_size=32, shuffle=True, drop_last=True,
                    generator=torch.Generator().manual_seed(rank))

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 3], gamma=0.3)
crit = nn.CrossEntropyLoss()

os.makedirs(args.ckpt_dir, exist_ok=True)
for epoch in range(args.epochs):
    running = 0.0
    for xb, yb in loader:
        opt.zero_grad(set_to_none=True)
        out = model(xb)
        loss = crit(out, yb)
        loss.backward()
        opt.step()
        running += loss.item()
    sched.step()
    if rank == 0:
        torch.save({"epoch": epoch, "model": model.module.state_dict(), "opt": opt.state_dict()},
                   os.path.join(args.ckpt_dir, f"ckpt_{epoch}.pt"))
        print(f"epoch {epoch} mean loss {running / len(loader):.4f}", flush=True)
    dist.barrier()

dist.destroy_process_group()
