"""Gradient-communication schemes, one module each, as DDP communication hooks.

So far: :mod:`.pactrain`. The scheme registry and the baselines (allreduce, fp16, topk,
powersgd, terngrad) arrive with the training loop.
"""
