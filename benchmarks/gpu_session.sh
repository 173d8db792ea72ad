#!/usr/bin/env bash
# Everything docs/results/gpu.md shows, measured again as records, in one call on a lent GPU
# machine (the device tool's `run`, whose $OUT comes back). Prepared on a machine without a
# GPU and never run as a whole: its compute_time and schemes steps have run here on the CPU
# (--device cpu), selftest --gpu and the NCCL sweep only on the GPU session of 2026-11-23.
#
#   OUT=/some/dir benchmarks/gpu_session.sh        # as root, from the checkout, testbed installed
#
# Then here: python -m benchmarks.archive OUT/compute-fp32 OUT/compute-bf16 --name compute-time-h100-DATE,
# OUT/schemes --name scheme-costs-gpu-DATE, OUT/sweep --name gpu-sweep-DATE, and regenerate.
# Each step's output also goes to OUT/*.log; a failed step does not stop the others.
set -uo pipefail
: "${OUT:?set OUT to an empty folder}"
py=${PYTHON:-python}
step() { local name=$1; shift; echo "== $name: $*"; "$@" >"$OUT/$name.log" 2>&1; echo "   exit $?"; tail -3 "$OUT/$name.log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1
step selftest testbed selftest --gpu --json
step compute-fp32 "$py" -m benchmarks.compute_time --device cuda --record "$OUT/compute-fp32"
step compute-bf16 "$py" -m benchmarks.compute_time --device cuda --amp --record "$OUT/compute-bf16"
step schemes "$py" -m benchmarks.schemes --device cuda --ranks 0 --reps 10 --record "$OUT/schemes"
step sweep testbed sweep --schemes allreduce,fp16,topk:0.01,pactrain:0.5:exact,pactrain:0.5:ternary \
    --bw 500mbit,1gbit --model resnet18 --max-iters 16 --eval-every 16 --backend nccl --out "$OUT/sweep"
