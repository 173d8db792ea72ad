#!/usr/bin/env bash
# The device tool's one call (2026-11-28 on an H100): install testbed offline over the image's
# torch from the wheels and .debs carried in .whl/ (benchmarks/gpu_session.sh's header says
# which), then gpu_session.sh within 535 s, then everything in one tarball under $OUT (the
# tool brings back at most 8 files).   run(command="bash benchmarks/gpu_device.sh", carry=[".whl"])
set -u
t0=$(date +%s)
for f in .whl/*.deb; do dpkg -x "$f" /; done; ldconfig
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl >"$OUT/pip.log" 2>&1; then
    echo "venv install refused; --target a temporary folder"; cat "$OUT/pip.log" | tail -3
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
    export PYTHONPATH=$site PATH=$site/bin:$PATH
fi
export PATH=$(python3 -c 'import sys,os;print(os.path.dirname(sys.executable))'):$PATH PYTHON=python3 PYTHONUNBUFFERED=1
which testbed iperf3 python3; iperf3 --version | head -1
python3 -c 'import torch,testbed;print(torch.__version__, torch.cuda.is_available(), torch.cuda.nccl.version(), testbed.__file__)'
testbed doctor 2>&1 | tail -15
W=$(mktemp -d)/gpuout; mkdir $W; date -u +%FT%TZ >$W/started; git rev-parse HEAD >$W/commit 2>/dev/null || true
cp -r /proc/cpuinfo $W/cpuinfo 2>/dev/null; nproc >$W/nproc
DEADLINE=$((t0 + 535)) OUT=$W bash benchmarks/gpu_session.sh
echo "== done after $(( $(date +%s) - t0 ))s"
tar --exclude='*.pt' --exclude='*.pth' --exclude='*.ckpt' -czf "$OUT/gpu.tar.gz" -C "$(dirname "$W")" gpuout
cp $W/*.log "$OUT/" 2>/dev/null; ls -la "$OUT"
