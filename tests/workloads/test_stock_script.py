"""The stock GPU-style script (examples/ddp_gpu_style.py: `cuda:LOCAL_RANK`, NCCL; the CPU
and gloo without CUDA) runs unchanged under plain torchrun, here with CUDA hidden (its CPU
path). Its GPU path runs on a lent GPU, under torchrun and across a testbed
(benchmarks/gpu_session.sh); that each rank's cuda:0 is its own GPU across a testbed is
tests/unit/test_gpu_numbering.py's table, per backend and host kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_stock_script_trains_under_plain_torchrun_each_process_on_its_local_rank(tmp_path):
    records = tmp_path / "records.jsonl"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "examples" / "ddp_gpu_style.py"), "40"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "TESTBED_RECORDS": str(records), "OMP_NUM_THREADS": "1",
                            "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = [json.loads(x) for x in records.read_text().splitlines()]
    assert sorted({(x["local_rank"], x["device"]) for x in recs}) == [(0, "cpu"), (1, "cpu")]
    assert len(recs) == 80 and max(x.get("accuracy", 0) for x in recs) > 0.5
    assert "40 steps on 2 ranks (cpu)" in r.stdout
