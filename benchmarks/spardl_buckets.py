"""SparDL once per DDP bucket (as the hook runs it) against once over the whole model (as
the paper does), on the same gradients: one ResNet18 iteration's, after DDP's rebuild, no
residuals. Called by every rank of ``benchmarks.schemes --spardl-buckets``' process group
(two domains); rank 0 prints the comparison and returns it as rows for ``--record``
(``part``: "spardl buckets"), which ``benchmarks.training_tables.spardl_buckets`` renders.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from workloads import compat, schemes
from workloads.models import build_model
from workloads.schemes import spardl

DENSITY = 0.01


def _bucket_gradients(model: str, where, x: torch.Tensor, y: torch.Tensor):
    """This rank's gradients laid out as SparDL's rebuilt buckets, in the order DDP ran them,
    and the state whose teams they would be exchanged in."""
    torch.manual_seed(0)
    ddp = compat.ddp(build_model(model, 10), forward_sync_buffers=False)
    state = schemes.get("spardl").attach(ddp, schemes.SchemeOptions(placement=where, spardl_density=DENSITY), None)
    for _ in range(2):  # DDP rebuilds its buckets after iteration 1
        ddp.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
    local = build_model(model, 10)
    local.load_state_dict(ddp.module.state_dict())
    nn.functional.cross_entropy(local(x), y).backward()
    grads = {id(p): q.grad.reshape(-1) for p, q in zip(ddp.module.parameters(), local.parameters())}
    vecs = []
    for key, res in state.residuals.items():
        v = torch.zeros_like(res)
        for pid in key:
            _, off, n = state.where[pid]
            v[off:off + n] = grads[pid]
        vecs.append(v)
    return vecs, state


def compare(model: str, where, x: torch.Tensor, y: torch.Tensor) -> list[dict]:
    """Both ways on every rank; rank 0's rows (others: empty): buckets, k per block, entries
    in the result, relative error and kept share against the dense average, time, messages,
    and what an oracle keeping the same total k of the dense average would keep."""
    vecs, state = _bucket_gradients(model, where, x, y)
    dense = torch.cat(vecs)
    dist.all_reduce(dense)
    dense /= dist.get_world_size()
    rows = []
    for label, parts in (("per bucket (as run)", vecs), ("whole model (paper)", [torch.cat(vecs)])):
        st = spardl.SparDLState(density=DENSITY, teams=state.teams, world=state.world, rank=state.rank)
        dist.barrier()
        t0 = time.perf_counter()
        res = torch.cat([spardl.sparse_allreduce(st, v.clone())[0] for v in parts])
        took = time.perf_counter() - t0
        p = len(st.team)
        rows.append({"part": "spardl buckets", "scheme": label, "ranks": dist.get_world_size(),
                     "teams": len(state.teams), "entries": dense.numel(), "density": DENSITY, "buckets": len(parts),
                     "k": [spardl.geometry(v.numel(), p, DENSITY)[1] for v in parts],
                     "nonzero": int(res.count_nonzero()), "error": float((res - dense).norm() / dense.norm()),
                     "kept": float((res * dense).sum() / dense.norm() ** 2), "took_s": took, "messages": st.messages})
    k_all = sum(rows[-1]["k"]) * p
    oracle = float(dense.abs().topk(k_all).values.square().sum() / dense.square().sum())
    for row in rows:
        row.update(oracle_k=k_all, oracle_kept=oracle)
    if dist.get_rank() != 0:
        return []
    print(f"\nSparDL per bucket vs whole model ({model}, {dense.numel()} entries, density {DENSITY}, "
          f"d = {len(state.teams)}, same gradients, no residuals):")
    for r in rows:
        print(f"  {r['scheme']:<20} {r['buckets']} bucket(s), k per block {r['k']}, {r['nonzero']} entries in the "
              f"result, |result - dense| / |dense| = {r['error']:.4f}, <result, dense> / |dense|^2 = "
              f"{r['kept']:.4f}, {r['took_s'] * 1000:.0f} ms, {r['messages']} messages")
    print(f"  oracle: the {k_all} largest entries of the dense average hold {oracle:.4f} of its squared norm")
    return rows
