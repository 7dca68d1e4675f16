"""Model, data and training as Flower's PyTorch template writes them (offline Fashion-MNIST)."""

import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _idx(path: Path) -> np.ndarray:
    data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(folder: Path, stem: str) -> Path:
    return folder / stem if (folder / stem).exists() else folder / f"{stem}.gz"


def load_data(partition_id: int, num_partitions: int, data_dir: str, max_examples: int):
    """This client's IID slice of the first ``max_examples`` training images, and its test slice."""
    folder = Path(data_dir)
    images = _idx(_find(folder, "train-images-idx3-ubyte"))[:max_examples]
    x = torch.tensor(images, dtype=torch.float32) / 255.0
    y = torch.tensor(_idx(_find(folder, "train-labels-idx1-ubyte"))[:max_examples],
                     dtype=torch.int64)
    idx = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    return x[idx].unsqueeze(1), y[idx]


def train(net, x, y, epochs, lr, batch_size):
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    running_loss, steps = 0.0, 0
    for _ in range(epochs):
        for start in range(0, len(y), batch_size):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x[start:start + batch_size]), y[start:start + batch_size])
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            steps += 1
    return running_loss / max(steps, 1)


def test(net, x, y):
    net.eval()
    with torch.no_grad():
        out = net(x)
        return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()
