#!/usr/bin/env bash
# Everything docs/results/gpu.md shows, measured again as records, in one call on a lent GPU
# machine (the device tool's `run`, whose $OUT comes back). An earlier form of it ran on
# 2026-11-28 on an H100 (docs/results/gpu.md): the self-test through `testbed selftest --gpu
# --json` (recorded afterwards with `benchmarks.selftest --from`), no machine.json; within
# 535 s all but the sweep's last two cells. This form, with those two, has not run on a GPU.
#
#   OUT=/some/dir [DEADLINE=epoch-s] benchmarks/gpu_session.sh   # as root, from the checkout, testbed installed
#
# The device machine has no network: build wheels here (pyroute2, typer, bcrypt and
# `pip wheel --no-deps .`) and iperf3's .debs, carry them, install them there first.
# Then here, with MACHINE=OUT/machine.json (that machine, not this one):
#   python -m benchmarks.archive OUT/selftest --name gpu-selftest-DATE --machine $MACHINE
#   python -m benchmarks.archive OUT/compute-fp32 OUT/compute-bf16 --name compute-time-DATE --machine $MACHINE
#   python -m benchmarks.archive OUT/schemes --name scheme-costs-DATE --machine $MACHINE
#   python -m benchmarks.archive OUT/sweep/sweep-* --name gpu-sweep-DATE --machine $MACHINE
# point gpu.md's blocks at them, and python -m benchmarks.regenerate.
# Each step's output also goes to OUT/*.log; a failed step does not stop the others.
# DEADLINE (epoch seconds, optional) bounds the whole: each step gets at most its own cap and
# what is left before it (SIGINT first, as Ctrl-C, so a run downs its testbed), the sweep last.
set -uo pipefail
: "${OUT:?set OUT to an empty folder}"
py=${PYTHON:-python}
deadline=${DEADLINE:-$(( $(date +%s) + 86400 ))}
[[ $deadline =~ ^[0-9]+$ ]] || { echo "DEADLINE: whole seconds since the epoch (date +%s)" >&2; exit 2; }
step() {
    local name=$1 cap=$2; shift 2
    local left=$(( deadline - $(date +%s) )); (( left < cap )) && cap=$left
    if (( cap < 20 )); then echo "== $name: not started, ${left}s left"; return; fi
    echo "== $name (at most ${cap}s): $*"
    timeout -s INT -k 20 "$cap" "$@" >"$OUT/$name.log" 2>&1; echo "   exit $?"; tail -3 "$OUT/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1
"$py" -m benchmarks.machine >"$OUT/machine.json"
step selftest 230 "$py" -m benchmarks.selftest --gpu --record "$OUT/selftest"
# a stock script that takes cuda:LOCAL_RANK, under plain torchrun and across a testbed
step stock-torchrun 60 "$py" -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp_gpu_style.py 20
step stock-testbed 90 testbed run --script examples/ddp_gpu_style.py --topology topologies/dumbbell.yaml \
    --out "$OUT/stock" --json -- 20
step compute-fp32 60 "$py" -m benchmarks.compute_time --device cuda --record "$OUT/compute-fp32"
step compute-bf16 60 "$py" -m benchmarks.compute_time --device cuda --amp --record "$OUT/compute-bf16"
step schemes 90 "$py" -m benchmarks.schemes --device cuda --ranks 0 --reps 10 --record "$OUT/schemes"
step sweep 600 testbed sweep --schemes allreduce,fp16,topk:0.01,pactrain:0.5:exact,pactrain:0.5:ternary \
    --bw 500mbit,1gbit --model resnet18 --max-iters 16 --eval-every 16 --backend nccl --out "$OUT/sweep"
