"""Model shapes for benchmarks/memory_prediction.py: a CNN, a transformer, an MLP.

Small enough to run on CPU in seconds, shaped like the real thing (residual conv
blocks with BatchNorm; pre-norm attention blocks; a wide MLP), so memory grows
with the batch the way theirs does.
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU(inplace=True), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.body(x))


def cnn():
    """ResNet-like: stem, two stages of residual blocks, pooling, classifier (3x32x32)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        Block(32), Block(32), nn.Conv2d(32, 64, 3, stride=2, padding=1), Block(64), Block(64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 100))


def transformer():
    """A pre-norm encoder over (batch, 64 tokens, 128 features)."""
    layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.1, batch_first=True,
                                       norm_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
                         nn.LayerNorm(128), nn.Linear(128, 1000))


def mlp():
    """A wide MLP over 1024 features."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 10))
