"""Plain-torch models for 32x32 images (no torchvision), each with width/depth knobs.

``width`` multiplies every channel count (and ViT's embedding), ``depth`` caps the number
of blocks per stage (ResNet), convolutions per stage (VGG) or transformer layers (ViT),
so CPU runs stay small while keeping each architecture's shape. ``width=1, depth=None``
is the architecture as published (CIFAR variants: 3x3 stem, no max-pool for ResNet).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn


def _ch(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


# ---------------------------------------------------------------- small CNN
class SmallCNN(nn.Module):
    """Two conv layers and two linear layers: seconds per epoch on the digits set."""

    def __init__(self, num_classes: int, in_channels: int = 3, width: float = 1.0):
        super().__init__()
        c1, c2, h = _ch(32, width), _ch(64, width), _ch(128, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * 8 * 8, h), nn.ReLU(inplace=True),
                                        nn.Linear(h, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


# ---------------------------------------------------------------- ResNet (CIFAR variant)
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(cin, planes, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        cout = planes * 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    def __init__(self, block, blocks: list[int], num_classes: int, in_channels: int = 3,
                 width: float = 1.0, depth: int | None = None):
        super().__init__()
        planes = [_ch(c, width) for c in (64, 128, 256, 512)]
        if depth is not None:
            blocks = [min(n, depth) for n in blocks]
        self.stem = nn.Sequential(nn.Conv2d(in_channels, planes[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(planes[0]), nn.ReLU(inplace=True))
        layers, cin = [], planes[0]
        for i, (p, n) in enumerate(zip(planes, blocks)):
            for j in range(n):
                layers.append(block(cin, p, 2 if (i > 0 and j == 0) else 1))
                cin = p * block.expansion
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x):
        return self.head(self.layers(self.stem(x)))


# ---------------------------------------------------------------- VGG19 with batch norm
_VGG19 = [[64, 64], [128, 128], [256, 256, 256, 256], [512, 512, 512, 512], [512, 512, 512, 512]]


class VGG(nn.Module):
    def __init__(self, stages: list[list[int]], num_classes: int, in_channels: int = 3,
                 width: float = 1.0, depth: int | None = None):
        super().__init__()
        layers, cin = [], in_channels
        for stage in stages:
            for c in stage[:depth] if depth is not None else stage:
                c = _ch(c, width)
                layers += [nn.Conv2d(cin, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
                cin = c
            layers.append(nn.MaxPool2d(2))  # 32 -> 1 after five stages
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


# ---------------------------------------------------------------- ViT-B/16 for 32x32
class ViT(nn.Module):
    """ViT-Base (12 layers, 768 wide, 12 heads, MLP 3072) adapted to 32x32 inputs.

    A 16x16 patch would leave 4 tokens of a 32x32 image, so the adaptation uses 4x4
    patches (64 tokens + a class token), as CIFAR ViTs commonly do. ``width`` scales the
    embedding (rounded to a multiple of the head count), ``depth`` the number of layers.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, width: float = 1.0, depth: int | None = None,
                 patch: int = 4, image: int = 32, heads: int = 12):
        super().__init__()
        dim = max(heads, int(round(768 * width / heads)) * heads)
        layers = 12 if depth is None else depth
        self.patch = nn.Conv2d(in_channels, dim, patch, patch)
        tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.encoder(t))[:, 0])


# ---------------------------------------------------------------- registry
MODELS: dict[str, Callable[..., nn.Module]] = {
    "cnn": lambda nc, ic, w, d: SmallCNN(nc, ic, w),
    "resnet18": lambda nc, ic, w, d: ResNet(BasicBlock, [2, 2, 2, 2], nc, ic, w, d),
    "resnet152": lambda nc, ic, w, d: ResNet(Bottleneck, [3, 8, 36, 3], nc, ic, w, d),
    "vgg19": lambda nc, ic, w, d: VGG(_VGG19, nc, ic, w, d),
    "vit_b16": lambda nc, ic, w, d: ViT(nc, ic, w, d),
}


def build_model(name: str, num_classes: int, in_channels: int = 3, width: float = 1.0,
                depth: int | None = None) -> nn.Module:
    """A freshly initialised model; raises ValueError naming the valid choices."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    if not (width > 0 and math.isfinite(width)):
        raise ValueError(f"--width must be a positive number, got {width}")
    if depth is not None and depth < 1:
        raise ValueError(f"--depth must be >= 1, got {depth}")
    return MODELS[name](num_classes, in_channels, width, depth)
