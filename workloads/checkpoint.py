"""Checkpoints shared by every scheme's run, so comparisons start from the same weights.

Format (``torch.save`` of a dict, loadable with ``weights_only=True``)::

    {"format": 1, "model": "resnet18", "width": 1.0, "depth": None,
     "num_classes": 10, "dataset": "cifar10", "accuracy": 0.91, "state_dict": {...}}
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

FORMAT = 1


class CheckpointError(ValueError):
    pass


def save(path: str | Path, model: nn.Module, *, model_name: str, width: float, depth: int | None,
         num_classes: int, dataset: str, accuracy: float | None, epochs: float | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"format": FORMAT, "model": model_name, "width": width, "depth": depth,
                "num_classes": num_classes, "dataset": dataset, "accuracy": accuracy, "epochs": epochs,
                "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}, tmp)
    tmp.replace(path)


def load_into(model: nn.Module, path: str | Path, model_name: str, meta: dict | None = None) -> list[str]:
    """Copy a checkpoint's weights into ``model``; returns notes on what was skipped, and
    fills ``meta`` (if given) with the checkpoint's description (dataset, accuracy, ...).

    Tensors whose shape differs (the classifier when the class count changes, e.g. a
    CIFAR-10 checkpoint fine-tuned on CIFAR-100) keep their fresh initialisation.
    Anything else that does not fit is an error naming the mismatch.
    """
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"--init {path}: not a readable checkpoint ({e})") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise CheckpointError(f"--init {path}: not a workloads checkpoint (make one with python -m workloads.pretrain)")
    if ck["model"] != model_name:
        raise CheckpointError(f"--init {path} holds a {ck['model']!r} model, but --model is {model_name!r}")
    own = model.state_dict()
    missing = sorted(set(own) - set(ck["state_dict"]))
    if missing:
        raise CheckpointError(f"--init {path}: no weights for {', '.join(missing[:4])} "
                              f"(was it made with other --width/--depth? it has width {ck['width']}, "
                              f"depth {ck['depth']})")
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
                              f"(checkpoint width {ck['width']}, depth {ck['depth']}); match --width/--depth")
    model.load_state_dict(load, strict=False)
    if meta is not None:
        meta.update({k: ck.get(k) for k in ("model", "width", "depth", "num_classes", "dataset", "accuracy", "epochs")})
        meta["reinitialised"] = [n.split(":")[0] for n in notes]
    notes.insert(0, f"loaded {len(load)} tensors from {path} ({ck['model']} on {ck['dataset']}, "
                    f"accuracy {ck['accuracy']})")
    return notes
