# FAULT: desync. The model is never wrapped in DDP and gradients are never averaged: each rank
# trains its own copy on its own shard. (The only collectives are the all_reduce of the loss for
# logging and a barrier at each epoch end, which do not touch the weights.)
# Style: multiprocessing.Process per rank, hand-made batches from a per-rank shard, Adam, same seed
# on every rank (so the replicas DO start equal).
import os, socket, multiprocessing as mp
import torch, torch.nn as nn, torch.distributed as dist

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.head = nn.Linear(48, 1)
    def forward(self, x):
        return self.head(self.body(x))

def worker(rank, world, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2048, 8, generator=g); Y = (X ** 2).sum(1, keepdim=True) * 0.3 + X[:, :1]
    X, Y = X[rank::world], Y[rank::world]          # this rank's shard
    torch.manual_seed(0)
    model = MLP()                                   # <-- the fault: not DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    bs = 32
    for epoch in range(2):
        perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(X), bs):
            idx = perm[i:i + bs]
            pred = model(X[idx])
            loss = ((pred - Y[idx]) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            if (i // bs) % 8 == 0:
                avg = loss.detach().clone(); dist.all_reduce(avg); avg /= world
                if rank == 0:
                    print(f"epoch {epoch} it {i // bs} mean loss {avg.item():.4f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ps = [mp.Process(target=worker, args=(r, 2, port)) for r in range(2)]
    [p.start() for p in ps]; [p.join() for p in ps]
