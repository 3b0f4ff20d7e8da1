# HEALTHY. Style: one multiprocessing.Process per rank, no DDP: parameters broadcast from rank 0 at
# start, gradients averaged by hand (all_reduce SUM then divide by world size), SGD with momentum,
# hand-made batches drawn from a per-rank generator.
import os, socket, multiprocessing as mp
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 32); self.fc2 = nn.Linear(32, 32); self.out = nn.Linear(32, 3)
    def forward(self, x):
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))

def average_gradients(model, world):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world

def run(rank, world, port, steps):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234 + rank)           # different init on purpose ...
    model = Net()
    for p in model.parameters():             # ... then everyone takes rank 0's weights
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    centers = torch.randn(3, 10, generator=torch.Generator().manual_seed(99)) * 2
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        y = torch.randint(0, 3, (32,), generator=gen)
        x = centers[y] + torch.randn(32, 10, generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        average_gradients(model, world)
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    world, port = 2, free_port()
    procs = [mp.Process(target=run, args=(r, world, port, 60)) for r in range(world)]
    for p in procs: p.start()
    for p in procs: p.join()
