"""Checkpoints shared by every scheme's run, so comparisons start from the same weights.

Format (``torch.save`` of a dict, loadable with ``weights_only=True``, the only way it is
loaded: a checkpoint may be a file another user planted)::

    {"format": 1, "model": "resnet18", "width": 1.0, "depth": None,
     "num_classes": 10, "dataset": "cifar10", "accuracy": 0.91, "state_dict": {...}}
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from workloads import untrusted

FORMAT = 1
CHECKPOINT_LIMIT = 64 << 30
"""Bytes a checkpoint may have (testbed's check of --init has the same bound)."""


class CheckpointError(ValueError):
    pass


def check_destination(path: str | Path) -> None:
    """CheckpointError (one line) when ``path``'s directory belongs to someone else and
    others may write to it (``/tmp``): another user could swap the checkpoint later runs load."""
    try:
        untrusted.check_directory(Path(path).parent)
    except untrusted.Refused as e:
        raise CheckpointError(f"will not write the checkpoint {path}: {e}; write it in a directory of "
                              f"your own (e.g. ~/ckpt/)") from None


def save(path: str | Path, model: nn.Module, *, model_name: str, width: float, depth: int | None,
         num_classes: int, dataset: str, accuracy: float | None, epochs: float | None = None) -> None:
    """Write the checkpoint without following links (a fresh 0600 temporary file beside
    ``path``, renamed over it: ``untrusted.write_replacing``); CheckpointError for a
    directory others may write (:func:`check_destination`)."""
    check_destination(path)
    obj = {"format": FORMAT, "model": model_name, "width": width, "depth": depth,
           "num_classes": num_classes, "dataset": dataset, "accuracy": accuracy, "epochs": epochs,
           "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
    try:
        untrusted.write_replacing(path, lambda f: torch.save(obj, f))
    except untrusted.Refused as e:  # the directory was made by someone else meanwhile
        raise CheckpointError(f"will not write the checkpoint {path}: {e}") from None


def _read(path: str | Path) -> tuple[object, str]:
    """(what the checkpoint holds, the sha256 of its bytes), read once from one descriptor:
    a regular file only, loaded with ``weights_only=True`` (tensors and plain containers;
    a pickle naming anything else is refused before it runs). CheckpointError, one line."""
    try:
        f = untrusted.open_checked(path, CHECKPOINT_LIMIT)
    except FileNotFoundError:
        raise CheckpointError(f"--init {path}: no such file") from None
    except (untrusted.Refused, OSError) as e:
        raise CheckpointError(f"--init {path}: not a readable checkpoint ({_one_line(e)})") from None
    with f:
        digest = untrusted.sha256_of(f)
        f.seek(0)
        try:
            with warnings.catch_warnings():  # torch warns (lines of it) about the pickle protocol of foreign files
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                return torch.load(f, map_location="cpu", weights_only=True), digest
        except pickle.UnpicklingError as e:
            raise CheckpointError(f"--init {path}: not loaded: it holds what a weights-only load refuses "
                                  f"({_refusal(e)}); make checkpoints with python -m workloads.pretrain "
                                  f"and load none another user could have written") from None
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file
            raise CheckpointError(f"--init {path}: not a readable checkpoint ({type(e).__name__}: "
                                  f"{_one_line(e)})") from None


def _refusal(e: Exception) -> str:
    """The reason in torch's weights-only refusal, without its advice to load unrestricted."""
    lines = str(e).splitlines()
    if lines and lines[0].startswith("Weights only load failed"):
        lines = lines[1:]
    kept = [ln.strip().removeprefix("WeightsUnpickler error:").strip() for ln in lines
            if not ln.startswith(("Check the documentation", "Please file an issue"))]
    return _one_line(" ".join(ln for ln in kept if ln) or "objects other than tensors")


def _one_line(e) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def load_into(model: nn.Module, path: str | Path, model_name: str, meta: dict | None = None) -> list[str]:
    """Copy a checkpoint's weights into ``model``; returns notes on what was skipped, and
    fills ``meta`` (if given) with the checkpoint's description (dataset, accuracy, ...) and
    the sha256 of the file's bytes (what the run records as ``init.sha256``).

    Tensors whose shape differs (the classifier when the class count changes, e.g. a
    CIFAR-10 checkpoint fine-tuned on CIFAR-100) keep their fresh initialisation.
    Anything else that does not fit is an error naming the mismatch.
    """
    ck, digest = _read(path)
    if not (isinstance(ck, dict) and ck.get("format") == FORMAT and isinstance(ck.get("model"), str)
            and isinstance(ck.get("state_dict"), dict)
            and all(isinstance(v, torch.Tensor) for v in ck["state_dict"].values())):
        raise CheckpointError(f"--init {path}: not a workloads checkpoint (make one with python -m workloads.pretrain)")
    if ck["model"] != model_name:
        raise CheckpointError(f"--init {path} holds a {ck['model']!r} model, but --model is {model_name!r}")
    own = model.state_dict()
    missing = sorted(set(own) - set(ck["state_dict"]))
    if missing:
        raise CheckpointError(f"--init {path}: no weights for {', '.join(missing[:4])} "
                              f"(was it made with other --width/--depth? it has width {ck.get('width')}, "
                              f"depth {ck.get('depth')})")
    notes, load = [], {}
    for k, v in ck["state_dict"].items():
        if k not in own:
            raise CheckpointError(f"--init {path}: unexpected tensor {k} (other --width/--depth?)")
        if v.shape != own[k].shape:
            notes.append(f"{k}: checkpoint shape {tuple(v.shape)} != {tuple(own[k].shape)}, left freshly initialised")
            continue
        load[k] = v
    if len(notes) > 2:  # more than the classifier's weight and bias
        raise CheckpointError(f"--init {path}: {len(notes)} tensors differ in shape "
                              f"(checkpoint width {ck.get('width')}, depth {ck.get('depth')}); match --width/--depth")
    model.load_state_dict(load, strict=False)
    if meta is not None:
        meta.update({k: ck.get(k) for k in ("model", "width", "depth", "num_classes", "dataset", "accuracy", "epochs")})
        meta["reinitialised"] = [n.split(":")[0] for n in notes]
        meta["sha256"] = digest
    notes.insert(0, f"loaded {len(load)} tensors from {path} ({ck['model']} on {ck.get('dataset')}, "
                    f"accuracy {ck.get('accuracy')}, sha256 {digest[:16]})")
    return notes
