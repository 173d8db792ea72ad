"""Train a model in one process and write a checkpoint every scheme can start from.

    python -m workloads.pretrain --model cnn --dataset digits --epochs 2 --out ckpt/cnn-digits.pt

PacTrain (and every baseline, for a fair comparison) fine-tunes from pre-trained weights
(``python -m workloads.train --init PATH``); pruning a pre-trained model keeps what
matters, pruning a random one does not.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn

from workloads import checkpoint, data
from workloads.models import MODELS, build_model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.pretrain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn", help=f"one of: {', '.join(MODELS)}")
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--dataset", default="digits", help=f"one of: {', '.join(data.DATASETS)}")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--epochs", type=float, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="checkpoint file to write")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)  # before the model is built: its initial weights are seeded too
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        checkpoint.check_destination(args.out)  # before training, not after
        ds = data.load(args.dataset, args.data_dir)
        model = build_model(args.model, ds.num_classes, 3, args.width, args.depth)
    except (ValueError, data.DatasetError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    per_epoch = data.iterations_per_epoch(ds, 1, args.batch_size)
    total = max(1, int(args.epochs * per_epoch))
    gen = torch.Generator().manual_seed(args.seed)
    it, epoch, t0 = 0, 0, time.time()
    model.train()
    while it < total:
        for x, y in data.batches(ds, 0, 1, epoch, args.seed, args.batch_size, gen):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            it += 1
            if it >= total:
                break
        epoch += 1
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(ds.x_test[s:s + 256]).argmax(1) == ds.y_test[s:s + 256]).sum())
                      for s in range(0, len(ds.y_test), 256))
    acc = correct / len(ds.y_test)
    try:
        checkpoint.save(args.out, model, model_name=args.model, width=args.width, depth=args.depth,
                        num_classes=ds.num_classes, dataset=ds.name, accuracy=acc, epochs=args.epochs)
    except (checkpoint.CheckpointError, OSError) as e:
        print(f"error: could not write {args.out}: {e}", file=sys.stderr)
        return 2
    print(f"pretrained {args.model} on {ds.name}: {it} iterations in {time.time() - t0:.1f} s, "
          f"test accuracy {acc:.4f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
