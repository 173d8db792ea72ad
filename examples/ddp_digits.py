"""Plain PyTorch DDP on scikit-learn's digits: `torchrun --standalone --nproc-per-node 2
examples/ddp_digits.py`, or unchanged across a testbed: `testbed run --script examples/ddp_digits.py`."""
import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int, nargs="?", default=60)
ap.add_argument("--lr", type=float, default=0.1)
args = ap.parse_args()
steps, lr = args.steps, args.lr
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
test_x, test_y, x, y = x[:300], y[:300], x[300 + rank::world], y[300 + rank::world]  # a shard per rank
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # one dense all-reduce a step
out = open(os.environ["TESTBED_RECORDS"], "a") if "TESTBED_RECORDS" in os.environ else None
for step in range(1, steps + 1):
    t0 = time.time()
    idx = torch.randint(0, len(x), (32,))
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()  # DDP all-reduces the gradients here
    opt.step()
    rec = {"iter": step, "time": time.time(), "iter_s": time.time() - t0, "loss": loss.item(),
           "payload_bytes": grad_bytes}
    if step % 20 == 0 or step == steps:
        with torch.no_grad():
            rec["accuracy"] = (model(test_x).argmax(1) == test_y).float().mean().item()
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()
if rank == 0:
    print(f"{steps} steps on {world} ranks: loss {loss.item():.3f}, accuracy {rec['accuracy']:.3f}")
del model, opt
gc.collect()  # DDP keeps gloo work in reference cycles: free it while the group lives
dist.barrier()
dist.destroy_process_group()  # (else ~1 run in 5 aborts at exit with torch 2.13's gloo)
