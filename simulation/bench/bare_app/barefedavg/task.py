"""The model, the data and one SGD step, as Flower's PyTorch template writes them."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """Flower's template CNN (fedhetero's cnn-small: the same layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class McMahanCNN(nn.Module):
    """McMahan et al.'s CNN (fedhetero's cnn-mcmahan: the same layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = {"cnn-small": Net, "cnn-mcmahan": McMahanCNN}


def _idx(folder: Path, stem: str) -> np.ndarray:
    path = folder / stem if (folder / stem).exists() else folder / f"{stem}.gz"
    data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@functools.lru_cache(maxsize=1)
def training_set(data_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST's training images in [0, 1] and labels, read once per process."""
    folder = Path(data_dir)
    x = torch.tensor(_idx(folder, "train-images-idx3-ubyte"), dtype=torch.float32) / 255.0
    y = torch.tensor(_idx(folder, "train-labels-idx1-ubyte"), dtype=torch.int64)
    return x.unsqueeze(1), y


@functools.lru_cache(maxsize=1)
def iid_split(num_examples: int, num_partitions: int) -> list[np.ndarray]:
    """IID partitions: a seeded permutation cut into ``num_partitions`` slices."""
    order = np.random.default_rng(0).permutation(num_examples)
    return np.array_split(order, num_partitions)


def load_partition(partition_id: int, num_partitions: int, data_dir: str):
    """This client's IID share of the training set."""
    x, y = training_set(data_dir)
    idx = torch.from_numpy(iid_split(len(y), num_partitions)[partition_id])
    return x[idx], y[idx]


def one_step(net: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
             batch_size: int, seed: int) -> float:
    """One SGD step on a random batch; returns its loss."""
    net.train()
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(y), generator=generator)[:batch_size]
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    optimizer.zero_grad()
    loss = F.cross_entropy(net(x[idx]), y[idx])
    loss.backward()
    optimizer.step()
    return float(loss)
