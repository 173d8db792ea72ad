"""Datasets as in-memory tensors of 3x32x32 images, and per-rank shards.

* ``cifar10`` / ``cifar100``: the standard python-pickle release read from ``--data-dir``
  (the directory holding ``cifar-10-batches-py`` / ``cifar-100-python``, or that
  directory itself). Nothing is downloaded.
* ``digits``: the real 8x8 handwritten digits bundled with scikit-learn (1797 images,
  10 classes, no download), upsampled to 32x32 and repeated over 3 channels so every
  model takes it; a fixed 80/20 split (1438 train, 359 test).
* ``synthetic``: a seeded, learnable 10-class set (class prototypes plus noise).

Sharding follows DistributedSampler: every epoch each rank takes its own disjoint slice of
one seeded permutation (the same on every rank), padded so all ranks run the same number
of iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workloads import names, untrusted

MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


DatasetError = names.DatasetError


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: torch.Tensor  # float32 N x 3 x 32 x 32, normalised
    y_train: torch.Tensor  # int64 N
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    augment: bool  # random crop + horizontal flip make sense (natural images)


def _normalise(x_uint8: torch.Tensor, name: str) -> torch.Tensor:
    mean, std = MEAN_STD[name]
    x = x_uint8.float().div_(255)
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


REFETCH = "extract the python version again from https://www.cs.toronto.edu/~kriz/cifar.html"


def _unpickle(path: Path) -> dict:
    """A CIFAR batch, through the restricted unpickler: a planted file that names anything
    but numpy arrays (``os.system``, ``builtins.exec``) is refused before it can run."""
    try:
        return untrusted.load_cifar_pickle(path)
    except FileNotFoundError:
        raise DatasetError(f"missing {path}") from None
    except untrusted.Refused as e:
        raise DatasetError(f"cannot read {path} as a CIFAR batch: {e}; {REFETCH}") from None
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file
        raise DatasetError(f"cannot read {path} as a CIFAR pickle: {type(e).__name__}: {_one_line(e)}; "
                           f"{REFETCH}") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _cifar_dir(data_dir: str | None, sub: str, name: str) -> Path:
    if not data_dir:
        raise DatasetError(f"--dataset {name} needs --data-dir: the directory holding {sub}/ "
                           f"(the python version from https://www.cs.toronto.edu/~kriz/cifar.html, "
                           f"extracted; nothing is downloaded)")
    base = Path(data_dir)
    for d in (base / sub, base):
        if d.is_dir() and any((d / f).exists() for f in ("data_batch_1", "train")):
            return d
    raise DatasetError(f"--data-dir {data_dir}: no {sub}/ with CIFAR files found; extract "
                       f"the python version of {name} there (nothing is downloaded)")


def _cifar_part(d: Path, files: list[str], label_key: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for f in files:
        batch = _unpickle(d / f)
        try:
            data, labels = batch[b"data"], batch[label_key]
        except (KeyError, TypeError, IndexError, ValueError):  # not a dict (a list, an array)
            raise DatasetError(f"{d / f}: not a CIFAR batch (no {b'data'!r}/{label_key!r})") from None
        try:
            xs.append(torch.as_tensor(data, dtype=torch.uint8).reshape(-1, 3, 32, 32))
            ys.append(torch.as_tensor(labels, dtype=torch.int64))
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise DatasetError(f"{d / f}: not a CIFAR batch ({type(e).__name__}: {_one_line(e)}); "
                               f"{REFETCH}") from None
    return torch.cat(xs), torch.cat(ys)


def load_cifar10(data_dir: str | None) -> Dataset:
    d = _cifar_dir(data_dir, "cifar-10-batches-py", "cifar10")
    xtr, ytr = _cifar_part(d, [f"data_batch_{i}" for i in range(1, 6)], b"labels")
    xte, yte = _cifar_part(d, ["test_batch"], b"labels")
    return Dataset("cifar10", _normalise(xtr, "cifar10"), ytr, _normalise(xte, "cifar10"), yte, 10, True)


def load_cifar100(data_dir: str | None) -> Dataset:
    d = _cifar_dir(data_dir, "cifar-100-python", "cifar100")
    xtr, ytr = _cifar_part(d, ["train"], b"fine_labels")
    xte, yte = _cifar_part(d, ["test"], b"fine_labels")
    return Dataset("cifar100", _normalise(xtr, "cifar100"), ytr, _normalise(xte, "cifar100"), yte, 100, True)


def _digits_arrays():
    """(images N x 8 x 8, labels) of scikit-learn's bundled digits.csv.gz.

    Read straight from the installed package (importing sklearn costs ~1.2 s per rank);
    ``sklearn.datasets.load_digits`` is the fallback should the file move.
    """
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DatasetError("--dataset digits needs scikit-learn (pip install scikit-learn); "
                           "it bundles the data, nothing is downloaded")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if csv.is_file():
        arr = np.loadtxt(csv, delimiter=",", dtype=np.float32)
        return arr[:, :-1].reshape(-1, 8, 8), arr[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sk_digits  # type: ignore[import-untyped]  # scikit-learn ships no types
    d = sk_digits()
    return d.images, d.target


def load_digits(data_dir: str | None = None) -> Dataset:
    images, target = _digits_arrays()
    x = torch.as_tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # N x 1 x 8 x 8 in [0, 1]
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    x = ((x - 0.5) / 0.5).repeat(1, 3, 1, 1)
    y = torch.as_tensor(target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # fixed split
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return Dataset("digits", x[tr].contiguous(), y[tr], x[te].contiguous(), y[te], 10, False)


def load_synthetic(data_dir: str | None = None, n_train: int = 2048, n_test: int = 512,
                   num_classes: int = 10, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    proto = F.interpolate(torch.randn(num_classes, 3, 4, 4, generator=g), size=(32, 32), mode="bilinear",
                          align_corners=False)

    def draw(n):
        y = torch.randint(0, num_classes, (n,), generator=g)
        return proto[y] + 1.5 * torch.randn(n, 3, 32, 32, generator=g), y

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    return Dataset("synthetic", xtr, ytr, xte, yte, num_classes, False)


DATASETS = {"cifar10": load_cifar10, "cifar100": load_cifar100, "digits": load_digits,
            "synthetic": load_synthetic}


def load(name: str, data_dir: str | None = None) -> Dataset:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return DATASETS[name](data_dir)


# ---------------------------------------------------------------- sharding and batches
def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int, shuffle: bool = True) -> torch.Tensor:
    """This rank's indices for one epoch, as torch's DistributedSampler picks them."""
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    else:
        order = torch.arange(n)
    per_rank = -(-n // world)
    pad = per_rank * world - n
    if pad:
        order = torch.cat([order, order[:pad]])
    return order[rank::world]


def batches(ds: Dataset, rank: int, world: int, epoch: int, seed: int, batch_size: int,
            generator: torch.Generator | None = None):
    """(x, y) batches of this rank's shard; the last partial batch is dropped so all
    ranks run the same number of iterations."""
    idx = shard_indices(len(ds.y_train), rank, world, epoch, seed)
    for s in range(0, len(idx) - batch_size + 1, batch_size):
        b = idx[s:s + batch_size]
        x = ds.x_train[b]
        if ds.augment:
            x = augment(x, generator)
        yield x, ds.y_train[b]


def iterations_per_epoch(ds: Dataset, world: int, batch_size: int) -> int:
    return (-(-len(ds.y_train) // world)) // batch_size


def augment(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random 32x32 crop of the 4-pixel zero-padded image and a random horizontal flip."""
    n = len(x)
    padded = F.pad(x, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (n,), generator=generator)
    dy = torch.randint(0, 9, (n,), generator=generator)
    rows = (dy.view(n, 1) + torch.arange(32)).view(n, 1, 32, 1).expand(n, 3, 32, 40)
    out = padded.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(32)).view(n, 1, 1, 32).expand(n, 3, 32, 32)
    out = out.gather(3, cols)
    flip = torch.rand(n, generator=generator) < 0.5
    out[flip] = out[flip].flip(3)
    return out
