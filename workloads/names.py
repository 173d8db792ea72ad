"""The names a workload command line may give, without importing torch: a launcher
(``testbed run``) checks a command line with them in a process that never trains.

Each list is the registry's keys (:data:`workloads.models.MODELS`,
:data:`workloads.data.DATASETS`); ``tests/workloads/test_models_data.py`` keeps them equal.
"""

from __future__ import annotations

MODEL_NAMES = ("cnn", "resnet18", "resnet152", "vgg19", "vit_b16")
DATASET_NAMES = ("cifar10", "cifar100", "digits", "synthetic")


class DatasetError(ValueError):
    """A dataset cannot be loaded; the message says how to fix it."""
