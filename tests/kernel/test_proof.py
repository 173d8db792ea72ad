"""The proof across real links (three_switch at 100mbit, real namespaces, gloo ranks): every
built-in scheme and the shipped example pass it with their bytes accounted for on every
link; a hook that exchanges nothing is unproven; ranks that exchange around their links,
all of them or one, are caught naming the link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.helpers import three_switch
from tests.kernel.conftest import cli

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("allreduce", "fp16", "topk", "powersgd", "terngrad", "pactrain:exact", "pactrain:ternary",
           "hier-allreduce", "prunex", "spardl")
SHORT = ["--max-iters", "3", "--eval-every", "3"]
EXTRA = {"powersgd": ["--max-iters", "5", "--", "--powersgd-start-iter", "2"],  # compressing from iteration 3
         "pactrain:exact": ["--", "--stable-iters", "1"], "pactrain:ternary": ["--", "--stable-iters", "1"],
         "prunex": ["--", "--prunex-prune-at", "0.2"]}
"""Each scheme's compressed path within a few iterations."""

# Enter another network namespace before torch starts (ctypes: os.setns is Python 3.12+).
SETNS = r'''
import ctypes, os, time, zlib
def setns(path):
    fd = os.open(path, os.O_RDONLY)
    assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0, ctypes.get_errno()  # CLONE_NEWNET
    os.close(fd)
'''
AROUND = SETNS + r'''
setns(os.environ["HOST_NETNS"])  # every rank into the host's namespace: loopback, no shaped link
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
import torch, torch.distributed as dist
port = 20000 + zlib.crc32(os.environ["TESTBED_RUN_DIR"].encode()) % 20000
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
t = torch.ones(250_000)
for i in range(3):
    dist.all_reduce(t)
    if RECORD:
        from workloads.records import record
        record(iter=i + 1, loss=0.0, payload_bytes=t.numel() * 4)
dist.barrier()
dist.destroy_process_group()
'''
NEIGHBOUR = SETNS + r'''
run = os.environ["TESTBED_RUN_DIR"]
rank = int(os.environ["RANK"])
if rank == 6:  # tells rank 7 where its namespace is
    with open(f"{run}/pid6.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(f"{run}/pid6.tmp", f"{run}/pid6")
if rank == 7:  # and rank 7 joins it: its traffic leaves by w6's link, w7's stays quiet
    while not os.path.exists(f"{run}/pid6"):
        time.sleep(0.05)
    setns(f"/proc/{open(f'{run}/pid6').read()}/ns/net")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(250_000)
for _ in range(3):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
'''
FILES = r'''
import os, time, torch, torch.distributed as dist
run = os.environ["TESTBED_RUN_DIR"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(1000, 100)  # 100,100 parameters: 400 kB of gradients a step, averaged through files
for step in range(3):
    loss = model(torch.randn(8, 1000)).square().mean()
    model.zero_grad()
    loss.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.save(flat, f"{run}/grad{step}.{rank}.tmp")
    os.rename(f"{run}/grad{step}.{rank}.tmp", f"{run}/grad{step}.{rank}.pt")
    while not all(os.path.exists(f"{run}/grad{step}.{r}.pt") for r in range(world)):
        time.sleep(0.01)
    avg = sum(torch.load(f"{run}/grad{step}.{r}.pt") for r in range(world)) / world
    with torch.no_grad():
        for p, g in zip(model.parameters(), avg.split([p.numel() for p in model.parameters()])):
            p -= 0.01 * g.view_as(p)
    dist.all_reduce(loss.detach())  # the only collective: the loss, 4 bytes a step
dist.barrier()
dist.destroy_process_group()
'''
BROKEN_TOPK = ("import sys, torch, torch.distributed as dist\n"
               "from workloads import train\n"
               "from workloads.schemes import topk\n"
               "def quiet(state, bucket):  # the bucket comes back unaveraged; a 4-byte token instead\n"
               "    dist.all_reduce(torch.zeros(1))\n"
               "    f = torch.futures.Future(); f.set_result(bucket.buffer()); return f\n"
               "topk.topk_hook = quiet\n"
               "train.main(sys.argv[1:])\n")
QUIET_HOOK = ("import torch\n"
              "def keep(process_group):\n"
              "    def hook(state, bucket):\n"
              "        f = torch.futures.Future(); f.set_result(bucket.buffer()); return f\n"
              "    return None, hook\n")


def _up(tmp_path, name: str, workers: set[str] | None = None):
    """three_switch as ``name``, with only ``workers`` (all eight when None), up while in use."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(three_switch(name, workers)))
    assert cli("up", str(path)).returncode == 0
    try:
        yield tmp_path
    finally:
        cli("down", name)


@pytest.fixture
def tproof(tmp_path, clean_kernel):
    yield from _up(tmp_path, "tproof")


@pytest.fixture
def tproof4(tmp_path, clean_kernel):
    """Two workers behind each edge switch: every scheme's exchange, the hierarchical ones'
    two levels included, with half the ranks (each imports torch: 1.5 s of CPU)."""
    yield from _up(tmp_path, "tproof4", {"w0", "w1", "w4", "w5"})


def _run(tmp_path, *args, testbed: str = "tproof") -> tuple[int, str, dict]:
    """(exit status, what it printed, the newest run's summary). The ranks inherit HOST_NETNS:
    this process's network namespace (the host's)."""
    r = cli("run", "-t", testbed, "--bw", "100mbit", "--out", str(tmp_path / "runs"), *args, timeout=600,
            env={"HOST_NETNS": f"/proc/{os.getpid()}/ns/net"})
    newest = max((tmp_path / "runs").glob("*/summary.json"), key=lambda p: p.stat().st_mtime, default=None)
    return r.returncode, r.stdout + r.stderr, json.loads(newest.read_text()) if newest else {}


def _print_bottlenecks(label: str, s: dict) -> None:
    rows = {k: v for k, v in s["proof_links"].items() if k.startswith(("s1-s0", "s2-s0"))}
    print(f"{label}: " + "; ".join(f"{k} {v['measured_bytes'] / v['bound_bytes']:.2f}x of {v['bound_bytes']:,} B"
                                   for k, v in rows.items()))


def test_every_scheme_and_the_example_pass_the_proof_at_100mbit(tproof4):
    for scheme in SCHEMES:
        rc, err, s = _run(tproof4, scheme, *SHORT, *EXTRA.get(scheme, []), testbed="tproof4")
        assert rc == 0, err
        if scheme.startswith("pactrain"):
            assert s["dense_iterations"] < s["iterations"], s  # its compact all-reduce ran
        assert (s["status"], s["proof"]) == ("ok", "passed"), (scheme, s.get("proof_reason"))
        assert s["collectives"]["collectives"]["train"], s["collectives"]  # the training's own exchange counted
        g = s["proof_gradients"]  # every iteration's gradients reached the scheme's collectives, at its floor
        assert g["checked"] and g["iterations"] == s["iterations"] and g["lost"] == 0, (scheme, g)
        assert s["bottleneck"]["measured_from"] == "training start"
        for name, row in s["proof_links"].items():  # every link (the workers' own too) carried its bound
            assert row["bound_bytes"] > 0 and row["measured_bytes"] >= row["bound_bytes"], (scheme, name, row)
        _print_bottlenecks(scheme, s)
    rc, err, s = _run(tproof4, "--script", str(ROOT / "examples" / "ddp_digits.py"), "--", "20", testbed="tproof4")
    assert rc == 0 and (s["status"], s["proof"]) == ("ok", "passed"), err
    assert s["bottleneck"]["measured_from"] == "training start"  # its process group was up
    _print_bottlenecks("examples/ddp_digits.py", s)


def test_a_hook_that_exchanges_nothing_is_unproven(tproof, monkeypatch):
    (tproof / "quiet.py").write_text(QUIET_HOOK)
    monkeypatch.chdir(tproof)
    rc, err, s = _run(tproof, "hook", "--hook", "quiet:keep", *SHORT)
    assert rc == 1 and "the run is unproven: the training issued no collective between ranks" in err, err
    assert (s["status"], s["proof"]) == ("unproven", "unproven")
    assert s["collectives"]["collectives"]["train"] == {}, s["collectives"]  # DDP's start-up sync: aside


@pytest.mark.parametrize("record", [False, True])
def test_ranks_that_exchange_around_their_links_are_bypassed(tproof, record):
    script = tproof / "around.py"
    script.write_text(f"RECORD = {record}\n" + AROUND)
    rc, err, s = _run(tproof, "--script", str(script))
    assert rc == 1 and "the collectives did not cross the shaped links: link w0-s1 forward carried" in err, err
    assert s["status"] == "bypassed" and s["proof_links"]["s1-s0 forward"]["bound_bytes"] == 3 * 10**6, s


def test_one_rank_that_leaves_by_another_ranks_link_is_caught(tproof):
    script = tproof / "neighbour.py"
    script.write_text(NEIGHBOUR)
    rc, err, s = _run(tproof, "--script", str(script))
    assert rc == 1 and "link w7-s2 forward carried" in err and "from ranks 7 to ranks 0,1,2,3,4,5,6" in err, err
    links = s["proof_links"]
    assert links["w7-s2 forward"]["measured_bytes"] < links["w7-s2 forward"]["bound_bytes"] / 10
    for name, row in links.items():  # every other link carried its bound: only w7's was bypassed
        if not name.startswith("w7-s2"):
            assert row["measured_bytes"] >= row["bound_bytes"], (name, row)


def test_what_the_proof_promises_for_your_own_code_and_for_the_built_in_trainer(tproof4, monkeypatch):
    """A script that averages its gradients through files and all-reduces only its loss ends ok,
    and its table and summary say what that does not show; the built-in trainer whose topk hook
    returns without communicating (run through -m, with a 4-byte token a bucket) is not ok."""
    script = tproof4 / "files.py"
    script.write_text(FILES)
    rc, out, s = _run(tproof4, "--script", str(script), testbed="tproof4")
    assert rc == 0 and (s["status"], s["proof"]) == ("ok", "passed"), out
    assert s["proof_gradients"]["checked"] is False and "through files" in s["proof_gradients"]["note"], s
    text = " ".join(out.replace("\u2502", " ").split())
    assert "not proven your own code: the proof sees only the bytes it hands to torch.distributed; that its " \
           "gradients were exchanged at all is not checked" in text, out
    (tproof4 / "broken_topk.py").write_text(BROKEN_TOPK)
    monkeypatch.chdir(tproof4)
    rc, out, s = _run(tproof4, "-m", "broken_topk", "--", "--scheme", "topk", *SHORT, testbed="tproof4")
    assert rc == 1 and "the run is unproven: the gradients did not all reach the collectives: rank 0 iteration 1: " \
        "its collectives carried" in out, out
    assert (s["status"], s["proof"]) == ("unproven", "unproven") and s["proof_gradients"]["checked"] is True, s
