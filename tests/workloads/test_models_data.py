"""Models build and run at every size knob; dataset loaders read the real formats."""

import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

from workloads import data
from workloads.models import MODELS, build_model


def _count(model, kind):
    return sum(1 for m in model.modules() if isinstance(m, kind))


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_classifies_32x32_images_and_shrinks_with_its_knobs(name):
    small = build_model(name, 10, width=0.125, depth=1)
    out = small(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in small.parameters())
    if name != "cnn":  # depth has no meaning for the 2-conv CNN
        wider = build_model(name, 10, width=0.25, depth=1)
        deeper = build_model(name, 10, width=0.125, depth=2)
        n = sum(p.numel() for p in small.parameters())
        assert sum(p.numel() for p in wider.parameters()) > 2 * n
        assert sum(p.numel() for p in deeper.parameters()) > n


def test_full_size_architectures_match_the_published_ones():
    # CIFAR ResNet18: 11,173,962 parameters for 10 classes (the widely used reference count)
    assert sum(p.numel() for p in build_model("resnet18", 10).parameters()) == 11_173_962
    r152 = build_model("resnet152", 100)
    convs = _count(r152, nn.Conv2d) - 4  # four projection shortcuts are not counted in "152"
    assert convs + _count(r152, nn.Linear) == 152
    vgg = build_model("vgg19", 10)
    assert _count(vgg, nn.Conv2d) == 16 and _count(vgg, nn.BatchNorm2d) == 16
    vit = build_model("vit_b16", 10, depth=1)
    layer = vit.encoder.layers[0]
    assert layer.self_attn.embed_dim == 768 and layer.self_attn.num_heads == 12
    assert layer.linear1.out_features == 3072
    assert len(build_model("vit_b16", 10, width=0.0625).encoder.layers) == 12


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="choose one of: cnn, resnet18"):
        build_model("resnet19", 10)


def _write_cifar10(root, n_per_batch=20):
    d = root / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, n_per_batch).tolist()
        with open(d / f, "wb") as fh:  # as the official release: bytes keys, protocol 2
            pickle.dump({b"batch_label": f.encode(), b"labels": y, b"data": x,
                         b"filenames": [b"x.png"] * n_per_batch}, fh, protocol=2)
        batches[f] = (x, y)
    return batches


def test_cifar10_loader_reads_the_python_pickle_release(tmp_path):
    batches = _write_cifar10(tmp_path)
    ds = data.load("cifar10", str(tmp_path))
    assert ds.x_train.shape == (100, 3, 32, 32) and ds.x_test.shape == (20, 3, 32, 32)
    assert ds.num_classes == 10 and ds.augment
    x, y = batches["data_batch_2"]
    assert ds.y_train[20:40].tolist() == y
    # row layout: 1024 red, 1024 green, 1024 blue values, each row-major 32x32
    mean, std = data.MEAN_STD["cifar10"]
    img = ds.x_train[20 + 3]
    for c in range(3):
        expect = (torch.tensor(x[3, c * 1024:(c + 1) * 1024], dtype=torch.float32).view(32, 32) / 255 - mean[c]) / std[c]
        torch.testing.assert_close(img[c], expect)
    assert data.load("cifar10", str(tmp_path / "cifar-10-batches-py")).x_train.shape[0] == 100


def test_cifar100_loader_uses_fine_labels(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    for f, n in (("train", 30), ("test", 10)):
        with open(d / f, "wb") as fh:
            pickle.dump({b"data": np.zeros((n, 3072), np.uint8), b"fine_labels": list(range(n)),
                         b"coarse_labels": [0] * n}, fh, protocol=2)
    ds = data.load("cifar100", str(tmp_path))
    assert ds.num_classes == 100 and ds.y_train.tolist() == list(range(30))


def test_cifar_errors_say_what_to_do(tmp_path):
    with pytest.raises(data.DatasetError, match="needs --data-dir"):
        data.load("cifar10", None)
    with pytest.raises(data.DatasetError, match="nothing is downloaded"):
        data.load("cifar10", str(tmp_path))
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    (d / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(data.DatasetError, match="data_batch_1"):
        data.load("cifar10", str(tmp_path))
    with pytest.raises(data.DatasetError, match="choose one of: cifar10, cifar100, digits, synthetic"):
        data.load("imagenet")


def test_digits_are_scikit_learns_bundled_set():
    from sklearn.datasets import load_digits
    ref = load_digits()
    ds = data.load("digits")
    assert len(ds.y_train) + len(ds.y_test) == 1797 == len(ref.target)
    assert ds.x_train.shape[1:] == (3, 32, 32)
    assert sorted(ds.y_train.tolist() + ds.y_test.tolist()) == sorted(ref.target.tolist())
    # the same images, in the fixed split's order, upsampled from sklearn's 0-16 pixels
    perm = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    for k in (0, 700):
        i = int(perm[359 + k])
        assert int(ds.y_train[k]) == int(ref.target[i])
        src = torch.tensor(ref.images[i], dtype=torch.float32).view(1, 1, 8, 8) / 16
        up = torch.nn.functional.interpolate(src, size=(32, 32), mode="bilinear", align_corners=False)
        torch.testing.assert_close(ds.x_train[k], ((up[0] - 0.5) / 0.5).expand(3, 32, 32))


def test_synthetic_is_seeded():
    a, b = data.load("synthetic"), data.load("synthetic")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)


@pytest.mark.parametrize("n,world", [(100, 3), (1438, 4), (10, 2)])
def test_shards_match_torch_distributed_sampler(n, world):
    for epoch in (0, 3):
        for rank in range(world):
            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=7)
            s.set_epoch(epoch)
            assert data.shard_indices(n, rank, world, epoch, 7).tolist() == list(s)


def test_augment_keeps_shapes_and_only_moves_pixels():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32)
    out = data.augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    # every output pixel is an input pixel of the same image/channel or padding zero
    for i in range(2):
        for c in range(3):
            assert set(out[i, c].unique().tolist()) <= set(x[i, c].unique().tolist()) | {0.0}


BIG = {"resnet152", "vit_b16"}  # seconds to build each: the suite prunes them, the quick pass does not


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in sorted(MODELS)])
def test_every_matrix_weight_of_every_model_is_pruned_at_the_ratio(name):
    """Conv, linear and attention (Q/K/V in_proj) weights are all prunable; at ratio 0.5
    what stays (the compact all-reduce's payload) is within 2 % of half the dense gradient."""
    from workloads import pruning

    model = build_model(name, 10, 3, 0.5, None)
    weights = pruning.prunable(model)
    not_prunable = [n for n, p in model.named_parameters() if p.dim() >= 2 and n not in weights]
    assert not_prunable == ([] if name != "vit_b16" else ["cls", "pos"]), not_prunable  # ViT's tokens
    if name == "vit_b16":
        assert any(n.endswith("in_proj_weight") for n in weights)
    masks = pruning.compute_masks(model, 0.5)
    dense = sum(p.numel() for p in model.parameters())
    removed = sum(int((~m).sum()) for m in masks.values())
    assert abs((dense - removed) / dense - 0.5) <= 0.02 * 0.5, (dense, removed)


def test_the_names_a_launcher_checks_are_the_registries():
    """workloads.names lists them without torch, for `testbed run`'s checks."""
    from workloads.data import DATASETS
    from workloads.names import DATASET_NAMES, MODEL_NAMES

    assert MODEL_NAMES == tuple(MODELS) and DATASET_NAMES == tuple(DATASETS)
