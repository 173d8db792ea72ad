"""What each rank hands to torch.distributed, counted by workloads.collectives in real gloo
processes: DDP's reducer (C++), comm hooks, the user's own collectives and sends, sub-groups;
the built-in trainer's training window (evaluations and DDP's bucket rebuild aside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workloads.collectives import RECORDER_ENTRIES, kind_of

from .launch import ROOT, free_port, train

SCRIPT = r'''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 10))   # 1010 floats
for _ in range(3):
    model(torch.randn(4, 100)).sum().backward()                             # C++ reducer all-reduces
dist.all_gather([torch.zeros(5) for _ in range(2)], torch.ones(5))        # 20 B piece
dist.broadcast(torch.ones(7, dtype=torch.float64), src=1)                 # 56 B
if r == 0:
    dist.send(torch.ones(3), 1)                                           # 12 B to rank 1
else:
    dist.recv(torch.zeros(3), 0)
ops = [dist.P2POp(dist.isend, torch.ones(9, dtype=torch.int8), 1 - r), dist.P2POp(dist.irecv, torch.zeros(9, dtype=torch.int8), 1 - r)]
for w in dist.batch_isend_irecv(ops):
    w.wait()                                                              # 9 B each way
g = dist.new_group([1])
if r == 1:
    dist.all_reduce(torch.ones(4), group=g)                               # a group of one
del model
import gc; gc.collect()
dist.barrier()
dist.destroy_process_group()
'''


def _env(tmp_path: Path, rank: int, port: int) -> dict:
    return dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                OMP_NUM_THREADS="1", TESTBED_COLLECTIVES=str(tmp_path / f"collectives{rank}.json"),
                TORCH_FR_BUFFER_SIZE=str(RECORDER_ENTRIES), TESTBED_STARTED=str(tmp_path / "started"))


def _ops(doc: dict, phase: str | None = None) -> dict:
    return {(o["group"], o["kind"]): (o["count"], o["in_bytes"], o["out_bytes"]) for o in doc["ops"]
            if phase is None or o["phase"] == phase}


def test_a_user_scripts_collectives_are_counted_whoever_issues_them(tmp_path):
    script = tmp_path / "mix.py"
    script.write_text(SCRIPT)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-P", "-m", "workloads.userscript", str(script)], cwd=tmp_path,
                              env=_env(tmp_path, r, port) | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (tmp_path / "started").exists()  # rank 0 said when its process group was up
    docs = [json.loads((tmp_path / f"collectives{r}.json").read_text()) for r in range(2)]
    for r, doc in enumerate(docs):
        assert doc["rank"] == r and doc["recorder_entries"] == RECORDER_ENTRIES and doc["uncounted"] == 0
        assert doc["groups"]["0"] == [0, 1]  # known after the script destroyed its groups
        ops = _ops(doc, "train")  # user code: every collective is its training's
        assert ops[("0", "all_reduce")][1] == 3 * 1010 * 4, ops  # DDP's reducer, from C++
        assert ops[("0", "all_gather")] == (2, 20 + 8, 40 + 16), ops  # ours and DDP's check of the ranks
        assert ops[("0", "broadcast")][1] >= 56 + 1010 * 4  # ours and DDP's initial parameter broadcast
        assert ("0", "send") not in ops and ("0", "recv") not in ops  # gloo's p2p: not in the recorder
    sends = [{s["dst"]: s["bytes"] for s in doc["sends"]} for doc in docs]
    assert sends == [{1: 12 + 9}, {0: 9}], sends  # send() and batch_isend_irecv, through isend
    assert docs[1]["groups"]["1"] == [1] and _ops(docs[1])[("1", "all_reduce")] == (1, 16, 16)
    assert "1" not in docs[0]["groups"]


def test_the_trainers_window_holds_its_exchange_and_not_evaluations_or_ddp_bookkeeping(tmp_path):
    env = {"TESTBED_COLLECTIVES": str(tmp_path / "collectives{rank}.json"),
           "TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES), "TESTBED_STARTED": str(tmp_path / "started")}
    res = train(2, tmp_path / "run", "--scheme", "allreduce", "--max-iters", "4", "--eval-every", "2",
                env=env)
    assert res.ok, res.logs
    first = min(r["time"] - r["iter_s"] for r in res.iters(0))
    assert (tmp_path / "started").stat().st_mtime <= first  # just before the first iteration
    doc = json.loads((tmp_path / "collectives0.json").read_text())
    train_ops, other = _ops(doc, "train"), _ops(doc, "other")
    assert set(train_ops) == {("0", "all_reduce")}, train_ops  # only the gradients' all-reduces
    buckets = train_ops[("0", "all_reduce")][0] / 4
    assert buckets == int(buckets) >= 1
    assert train_ops[("0", "all_reduce")][1] == 4 * res.summary()["dense_bytes"]
    assert other[("0", "broadcast")][0] >= 2  # DDP's start-up sync and bucket rebuild: aside
    assert other[("0", "all_reduce")][0] >= 2  # the two evaluations


def test_a_hook_that_exchanges_nothing_leaves_the_training_window_empty(tmp_path):
    (tmp_path / "quiet.py").write_text(
        "import torch\n"
        "def keep(process_group):\n"
        "    def hook(state, bucket):\n"
        "        f = torch.futures.Future(); f.set_result(bucket.buffer()); return f\n"
        "    return None, hook\n")
    env = {"TESTBED_COLLECTIVES": str(tmp_path / "collectives{rank}.json"),
           "TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    res = train(2, tmp_path / "run", "--scheme", "hook", "--hook", "quiet:keep", "--max-iters", "3",
                "--eval-every", "3", env=env)
    assert res.ok, res.logs
    for r in range(2):
        doc = json.loads((tmp_path / f"collectives{r}.json").read_text())
        assert _ops(doc, "train") == {} and doc["sends"] == [], doc


def test_profiling_names_map_to_kinds():
    assert kind_of("gloo:all_reduce") == "all_reduce" and kind_of("nccl:allreduce_coalesced") == "all_reduce"
    assert kind_of("nccl:_allgather_base") == "all_gather" and kind_of("nccl:all_gather_into_tensor_coalesced") \
        == "all_gather"
    assert kind_of("nccl:_reduce_scatter_base") == "reduce_scatter" and kind_of("gloo:alltoall_base") == "all_to_all"
    assert kind_of("nccl:send") == "send" and kind_of("gloo:something_new") == "something_new"


def test_entries_lost_to_a_wrapped_ring_are_counted_as_uncounted_per_recorder(tmp_path, monkeypatch):
    import pickle
    import types

    import torch

    from workloads.collectives import Ledger

    def entry(i, name="gloo:all_reduce"):
        return {"record_id": i, "profiling_name": name, "process_group": ("0", "default_pg"), "time_created_ns": 1,
                "input_sizes": [[10]], "input_dtypes": ["Float"], "output_sizes": [[10]], "output_dtypes": ["Float"],
                "is_p2p": False}

    dumps = {"_dump_fr_trace": [entry(i) for i in range(5)], "_dump_nccl_trace": [entry(0, "nccl:all_gather")]}
    fake = types.SimpleNamespace(**{k: (lambda *a, k=k: pickle.dumps({"entries": dumps[k]})) for k in dumps})
    monkeypatch.setattr(torch._C, "_distributed_c10d", fake)
    ledger = Ledger(tmp_path / "c.json", 0)
    ledger.fold()
    dumps["_dump_fr_trace"] = [entry(i) for i in range(10, 13)]  # 5..9 were overwritten before this fold
    ledger.fold()
    ledger.fold()  # nothing new: nothing counted twice
    doc = ledger.to_dict()
    assert doc["uncounted"] == 5 and doc["entries"] == 9
    assert {(o["kind"], o["count"], o["in_bytes"]) for o in doc["ops"]} == {("all_reduce", 8, 320),
                                                                           ("all_gather", 1, 40)}
