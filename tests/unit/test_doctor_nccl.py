"""`testbed doctor`'s NCCL row says what is missing: a CUDA build of torch, or a GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from testbed.engine import doctor  # noqa: E402


def _nccl(monkeypatch, cuda_version, available):
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(doctor, "gpu_names", list)
    [row] = [c for c in doctor._gpu() if c.name == "NCCL"]
    return row


def test_a_cpu_only_torch_is_told_to_install_a_cuda_build(monkeypatch):
    row = _nccl(monkeypatch, None, False)
    assert not row.ok and "CPU-only build" in row.detail and "install a CUDA build" in row.hint


def test_a_cuda_build_without_a_gpu_is_not_told_to_install_a_cuda_build(monkeypatch):
    row = _nccl(monkeypatch, "13.0", False)
    assert not row.ok and "(CUDA 13.0) sees no GPU" in row.detail, row
    assert "install a CUDA build" not in row.hint and "NVIDIA GPU" in row.hint
