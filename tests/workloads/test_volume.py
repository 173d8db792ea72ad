"""What each built-in scheme's collectives must carry per iteration (workloads.volume,
workloads.schemes.floors), in real gloo processes: every scheme's honest run meets its floor
in every iteration of every rank, with every gradient element handed to its hook, and the
floor is no token (within a few percent of what the compressed exchange carried). The
ledger's side: entries binned by iteration, ranges lost to a wrapped ring left unchecked.
A run that falls short is not ok: tests/workloads/test_proof_gradients.py."""

from __future__ import annotations

import json

import pytest

from testbed.runs import volume as proof_volume
from workloads.collectives import RECORDER_ENTRIES

from .launch import train

SCHEMES = [  # (scheme, its flags, switch domains): each one's compressed path within a few iterations
    ("allreduce", [], None), ("fp16", [], None), ("topk", [], None), ("gtopk", [], None),
    ("powersgd", ["--max-iters", "5", "--powersgd-start-iter", "2"], None), ("terngrad", [], None),
    ("pactrain", ["--stable-iters", "1"], None), ("pactrain", ["--stable-iters", "1", "--no-ternary"], None),
    ("spardl", [], None), ("spardl", [], [1, 1]), ("hier-allreduce", [], [1, 1]),
    ("prunex", ["--prunex-prune-at", "0.2"], None), ("prunex", ["--prunex-prune-at", "0.2"], [1, 1]),
]


@pytest.mark.slow
@pytest.mark.parametrize("scheme, flags, domains", SCHEMES,
                         ids=[f"{s}{''.join(f)}{'-domains' if d else ''}" for s, f, d in SCHEMES])
def test_every_built_in_scheme_meets_its_floor_in_every_iteration(tmp_path, scheme, flags, domains):
    env = {"TESTBED_COLLECTIVES": str(tmp_path / "collectives{rank}.json"), "TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES)}
    res = train(2, tmp_path / "run", "--scheme", scheme, "--max-iters", "3", "--eval-every", "3", *flags, env=env,
                domains=domains)
    assert res.ok, res.logs
    docs = [json.loads((tmp_path / f"collectives{r}.json").read_text()) for r in range(2)]
    verdict = proof_volume.judge({r: proof_volume.parse(doc, r) for r, doc in enumerate(docs)}, "trainer")
    assert verdict["checked"] and verdict["reason"] == "", verdict
    assert verdict["iterations"] == res.summary()["iterations"] and verdict["lost"] == 0
    for v in (doc["volume"] for doc in docs):
        assert v["scheme"] == scheme and v["elements"] * 4 == res.summary()["dense_bytes"]
        assert v["handed"] in (None, [v["elements"]] * len(v["floor"]))  # every bucket reached the hook
        last = len(v["floor"]) - 1  # compressed by then: the floor is within 5 % of what it carried
        assert 0 < v["floor"][last] <= v["carried"][last] <= 1.05 * v["floor"][last], v


def _entry(i: int, t_ns: int, group: str = "0") -> dict:
    return {"record_id": i, "profiling_name": "gloo:all_reduce", "process_group": (group, "pg"),
            "time_created_ns": t_ns, "input_sizes": [[10]], "input_dtypes": ["Float"], "output_sizes": [[10]],
            "output_dtypes": ["Float"], "is_p2p": False}


def test_the_ledger_bins_bytes_by_iteration_and_leaves_lost_ranges_unchecked(tmp_path, monkeypatch):
    import pickle
    import types

    import torch

    from workloads.collectives import Ledger
    from workloads.volume import Volume

    dumps = {"_dump_fr_trace": []}
    fake = types.SimpleNamespace(_dump_fr_trace=lambda *a: pickle.dumps({"entries": dumps["_dump_fr_trace"]}))
    monkeypatch.setattr(torch._C, "_distributed_c10d", fake)
    ledger = Ledger(tmp_path / "c.json", 0)
    ledger.groups = {"0": [0, 1], "1": [0]}
    monkeypatch.setattr(ledger, "_groups", lambda: None)
    ledger.volume = vol = Volume("fp16", 10, 4, dense=False, checked=True)
    for t in (100, 200, 300, 400):
        vol.begin(t)
        vol.bucket(10, 20)
    dumps["_dump_fr_trace"] = [_entry(0, 150), _entry(1, 160, group="1"), _entry(2, 250)]
    ledger.fold()
    dumps["_dump_fr_trace"] = [_entry(5, 420)]  # 3 and 4 (made between 250 and 420) were lost to the ring
    ledger.fold()
    doc = ledger.to_dict()["volume"]
    assert doc["carried"] == [40, 40, 0, 40]  # the group of one rank moves nothing
    assert doc["handed"] == [10] * 4 and doc["floor"] == [20] * 4 and doc["lost"] == [1, 2, 3]
    verdict = proof_volume.judge({0: proof_volume.parse({"volume": doc})}, "trainer")
    assert verdict["checked"] and verdict["reason"] == "" and verdict["lost"] == 3 and verdict["iterations"] == 1
