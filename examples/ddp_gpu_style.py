"""A stock GPU-style DDP script, as most torchrun scripts are written: each process takes
`cuda:LOCAL_RANK` (NCCL), or the CPU (gloo) where there is no CUDA. Unchanged under
`torchrun --nproc-per-node N` on one GPU machine, and across a testbed
(`testbed run --script examples/ddp_gpu_style.py`): there each rank is alone on its node, so
LOCAL_RANK is 0 and CUDA_VISIBLE_DEVICES shows it exactly its own GPU (a namespace's host
GPU, a container's or a VM's only one), which `cuda:0` then is."""
import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
if torch.cuda.is_available():
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int, nargs="?", default=60)
args = ap.parse_args()
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32, device=device), torch.tensor(y, device=device)
test_x, test_y, x, y = x[:300], y[:300], x[300 + rank::world], y[300 + rank::world]
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local_rank] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
out = open(os.environ["TESTBED_RECORDS"], "a") if "TESTBED_RECORDS" in os.environ else None
for step in range(1, args.steps + 1):
    t0 = time.time()
    idx = torch.randint(0, len(x), (32,), device=device)
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    rec = {"iter": step, "time": time.time(), "iter_s": time.time() - t0, "loss": loss.item(),
           "payload_bytes": grad_bytes, "device": str(device), "local_rank": local_rank}
    if step % 20 == 0 or step == args.steps:
        with torch.no_grad():
            rec["accuracy"] = (model(test_x).argmax(1) == test_y).float().mean().item()
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()
if rank == 0:
    print(f"{args.steps} steps on {world} ranks ({device}): accuracy {rec['accuracy']:.3f}")
del model, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
