"""A user's Flower project with a FLAT layout, built in a folder, and ways to run it.

Like Flower's quickstart-pytorch template: a top-level ``task.py`` (a small torch model
and in-file data behind DataLoaders of ``{"img", "label"}`` batches), ``client_app.py``,
``server_app.py`` and ``pyproject.toml``. Its ``import task`` must find ITS task.py while
fedhetero's client helpers come from ``strategies.client``.

The ClientApp is assembled from sections (``CLIENT_SECTIONS``: header, train, evaluate,
query) so that a test can swap one section for a documentation snippet
(tests/test_doc_snippets.py). :func:`run_inprocess` runs the project in a fresh
interpreter (so ``task`` is not fedhetero's package already imported by pytest) on a
minimal in-process Grid (``RUNNER``) and returns the summary the ServerApp writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests import warm_runner

REPO = Path(__file__).resolve().parents[1]
NUM_CLASSES = 3

PYPROJECT = '''\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "userproj"
version = "1.0.0"
description = "A user's flat Flower project that swaps in fedhetero's strategies"
dependencies = ["flwr[simulation]>=1.41,<1.43", "torch", "fedhetero"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "userproj"

[tool.flwr.app.components]
serverapp = "server_app:app"
clientapp = "client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
strategy = "fedavg"
local-epochs = 1
lr = 0.01
batch-size = 32
query-client-info = true
summary-file = ""
'''

TASK = '''\
"""userproj: model, data and training, shaped like Flower's quickstart-pytorch.

The same functions and signatures as the template's task.py (Net, load_data(partition_id,
num_partitions, batch_size), load_centralized_dataset(), train(net, trainloader, epochs,
lr, device) with SGD momentum 0.9, test(net, testloader, device)) on real Fashion-MNIST
from the Debian package (padded to 3 x 32 x 32, the quickstart's CIFAR-10 image shape),
read offline; partition p holds rows p*N..(p+1)*N of the training file.
"""

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

DATA = Path("/usr/share/datasets/fashion-mnist")  # apt-get install dataset-fashion-mnist
TRAIN_ROWS, TEST_ROWS, CENTRAL_ROWS = 3000, 150, 2000  # per partition; central test set


class Net(nn.Module):
    """The quickstart's CNN for 3 x 32 x 32 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

    def forward_with_representation(self, x):  # MOON's R_w(x): the 84-unit layer
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        z = F.relu(self.fc2(F.relu(self.fc1(x.view(-1, 16 * 5 * 5)))))
        return self.fc3(z), z


@lru_cache(maxsize=None)  # read once per process, as the quickstart keeps its FederatedDataset
def read_rows(split, first, count):
    """Rows first..first+count of a Fashion-MNIST split: images (count, 3, 32, 32) in
    [-1, 1] (Normalize(0.5, 0.5) as the quickstart), labels (count,)."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(DATA / f"{prefix}-images-idx3-ubyte.gz") as f:
        f.read(16 + 784 * first)
        pixels = np.frombuffer(f.read(784 * count), np.uint8).reshape(count, 28, 28)
    with gzip.open(DATA / f"{prefix}-labels-idx1-ubyte.gz") as f:
        f.read(8 + first)
        labels = np.frombuffer(f.read(count), np.uint8)
    images = torch.from_numpy(np.pad(pixels, ((0, 0), (2, 2), (2, 2)))).float() / 255.0
    images = ((images - 0.5) / 0.5).unsqueeze(1).repeat(1, 3, 1, 1)
    return images, torch.from_numpy(labels.astype(np.int64))


class Rows(Dataset):
    """{"img", "label"} items, as flwr-datasets gives them."""

    def __init__(self, split, first, count):
        self.images, self.labels = read_rows(split, first, count)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": self.images[i], "label": self.labels[i]}


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """This partition's train and test loaders."""
    del num_partitions  # every partition has TRAIN_ROWS rows of its own
    train = Rows("train", partition_id * TRAIN_ROWS, TRAIN_ROWS)
    test = Rows("test", partition_id * TEST_ROWS, TEST_ROWS)
    trainloader = DataLoader(train, batch_size=batch_size, shuffle=True)
    testloader = DataLoader(test, batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """The server's test set (rows the partitions do not use)."""
    return DataLoader(Rows("test", 10000 - CENTRAL_ROWS, CENTRAL_ROWS), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / len(trainloader)
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
'''

CLIENT_SECTIONS = {
    "header": '''\
"""userproj: ClientApp shaped like Flower's quickstart-pytorch."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from task import Net, load_data
from task import test as test_fn
from task import train as train_fn

# Flower ClientApp
app = ClientApp()
''',
    # the template's train handler, unchanged (FedAvg and FedProx need nothing more)
    "train": '''
@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)

    # Call the training function
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)
''',
    "evaluate": '''
@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(model, valloader, device)

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)
''',
    "query": "",
}

# The user's ClientApp with every strategy's helper: the template's train handler plus
# a branch per helper, on the user's own optimiser (SGD with momentum 0.9), which the
# helpers wrap or run; the replies keep the user's train_loss; and a query handler.
HELPER_TRAIN = '''
from strategies.client import (FedDynClient, MoonClient, ScaffoldClient, as_tensors,
                               client_info_reply, fedveca_train, is_dynamicfl_chunk,
                               is_feddyn_message, is_fedveca_round, is_moon_message,
                               is_scaffold_message, label_counts, loader_steps,
                               report_local_steps, train_chunk)


def train_with(model, trainloader, optimizer, epochs, device, forward=None):
    """The user's loop; ``forward`` gives (logits, extra loss) when a helper changes the loss."""
    criterion = torch.nn.CrossEntropyLoss().to(device)
    model.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            if forward is None:
                logits, extra = model(images), 0.0
            else:
                logits, extra = forward(model, images)
            loss = criterion(logits, labels)
            (loss + extra).backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / len(trainloader)


@app.train()
def train(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    config = msg.content["config"]
    if is_fedveca_round(config):  # FedVeca: tau plain-SGD steps (eq. 1), grad, beta, delta
        content = fedveca_train(model, trainloader, config, partition_id=partition_id)
        return Message(content=content, reply_to=msg)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)  # the user's
    if is_dynamicfl_chunk(config):  # DynamicFL: one chunk of the round's batch stream
        content = train_chunk(model, trainloader, config, context.state,
                              partition_id=partition_id, optimizer=optimizer)
        return Message(content=content, reply_to=msg)
    epochs = context.run_config["local-epochs"]
    helper, forward = None, None
    if is_scaffold_message(msg):  # SCAFFOLD: c_i in context.state, every step corrected
        helper = ScaffoldClient(msg, context.state)
        helper.wrap(optimizer, model)
    elif is_feddyn_message(msg):  # FedDyn: the regulariser's gradient before every step
        helper = FedDynClient(msg, context.state)
        helper.wrap(optimizer, model)
    elif is_moon_message(msg):  # MOON: l_sup + mu l_con, the previous model in context.state
        helper = MoonClient(msg, context.state, model)
        forward = helper.forward
    if helper is not None:
        train_loss = train_with(model, trainloader, optimizer, epochs, device, forward)
        metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
        return Message(content=helper.finish(model, metrics), reply_to=msg)
    train_loss = train_fn(model, trainloader, epochs, config["lr"], device)
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    metrics = report_local_steps(metrics, loader_steps(trainloader, epochs))  # FedNova's tau_i
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
'''

HELPER_QUERY = '''
@app.query()
def query(msg: Message, context: Context):
    partition_id = context.node_config["partition-id"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, context.node_config["num-partitions"], batch_size)
    _, y = as_tensors(trainloader)
    return client_info_reply(msg, partition_id=partition_id, num_examples=len(y),
                             label_counts=label_counts(y, num_classes=10))
'''

SERVER_HEADER = '''\
"""userproj: ServerApp shaped like Flower's quickstart-pytorch; fedhetero's strategy."""

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from strategies import DynamicFL, FedAvg, FedDyn, FedNova, FedProx, FedVeca, Moon, Scaffold
from strategies import HeteroFL
from strategies import FedRolex, FjORD
from strategies import FedLC
from task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()
HISTORY = []


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate model on central data."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    loss, accuracy = test(model, load_centralized_dataset(), device)
    HISTORY.append({"round": server_round, "loss": loss, "accuracy": accuracy})
    return MetricRecord({"accuracy": accuracy, "loss": loss})


central_evaluate = global_evaluate  # the name the older snippets use


# per parameter of Net, per axis: the hidden dimension it scales with (docs/strategies/width.md)
NET_WIDTHS = {"conv1.weight": (("conv1", 1), None, None, None), "conv1.bias": (("conv1", 1),),
              "conv2.weight": (("conv2", 1), ("conv1", 1), None, None),
              "conv2.bias": (("conv2", 1),),
              "fc1.weight": (("fc1", 1), ("conv2", 25)), "fc1.bias": (("fc1", 1),),
              "fc2.weight": (("fc2", 1), ("fc1", 1)), "fc2.bias": (("fc2", 1),),
              "fc3.weight": (None, ("fc2", 1)), "fc3.bias": (None,)}


def heterofl_strategy():
    """docs/strategies/width.md's server block, as the page writes it."""
    strategy = HeteroFL(width_spec=NET_WIDTHS, levels=(1.0, 0.5), width_rule="fixed",
                        scaler=False)  # WideNet has no Scaler module; the query is on by default
    return strategy


def make_strategy(name: str, query: bool):
    common = {"query_client_info": query}  # True: the ClientApp answers with client_info_reply
    width = {"fraction_evaluate": 0.0, **common}
    return {
        "heterofl": heterofl_strategy,
        "fjord": lambda: FjORD(width_spec=NET_WIDTHS, levels=(1.0, 0.5), width_rule="fixed", **width),
        "fedrolex": lambda: FedRolex(width_spec=NET_WIDTHS, levels=(1.0, 0.5), width_rule="fixed", **width),
        "flower-fedavg": lambda: FlowerFedAvg(fraction_evaluate=0.0),
        "fedavg": lambda: FedAvg(fraction_evaluate=0.0, **common),
        "fedprox": lambda: FedProx(proximal_mu=0.01, fraction_evaluate=0.0, **common),
        "fedlc": lambda: FedLC(tau=1.0, fraction_evaluate=0.0, **common),
        "fednova": lambda: FedNova(fraction_evaluate=0.0, steps_reported=True, **common),
        "fedveca": lambda: FedVeca(tau_init=50, tau_max=100, alpha=0.8, fraction_evaluate=0.0,
                                   **common),  # alpha: docs/strategies/fedveca.md
        "dynamicfl": lambda: DynamicFL(intervals="1-4", local_steps=94, beta=0.5, **common),
        "scaffold": lambda: Scaffold(fraction_evaluate=0.0, **common),
        "feddyn": lambda: FedDyn(alpha=0.01, fraction_evaluate=0.0, **common),
        "moon": lambda: Moon(mu=0.1, temperature=0.5, fraction_evaluate=0.0, **common),
    }[name]()


def write_summary(context: Context) -> None:
    path = context.run_config.get("summary-file", "")
    if path:
        with open(path, "w") as f:
            json.dump({"history": HISTORY}, f)
'''

# the ClientApp with every helper also serves packed messages (docs/simulation.md, packed
# simulation in your own project): two lines more than the template's header
HELPER_HEADER = CLIENT_SECTIONS["header"].replace(
    "# Flower ClientApp\napp = ClientApp()\n",
    "from strategies.client import virtual_clients\n\n"
    "# Flower ClientApp\napp = ClientApp(mods=[virtual_clients])\n")
assert HELPER_HEADER != CLIENT_SECTIONS["header"]

SERVER_MAIN = '''
@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    cfg = context.run_config
    strategy = make_strategy(cfg["strategy"], cfg["query-client-info"])
    lr = cfg["lr"] * (5 if cfg["strategy"] == "fedveca" else 1)  # plain SGD: docs/strategies/fedveca.md
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": lr, "batch-size": cfg["batch-size"],
                                   "momentum": 0.9}),  # the optimiser of task.train
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=global_evaluate,
    )
    write_summary(context)
'''

RUNNER = '''\
"""Run a Flower project's ServerApp against its ClientApp in this process (no Ray)."""

import json
import random
import sys

project, run_config, num_nodes = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, project)  # as Flower does for an app directory

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
import torch  # noqa: E402

import client_app  # noqa: E402
import server_app  # noqa: E402
import task  # noqa: E402


class LocalGrid(Grid):
    """Each message is one ClientApp call; one Context (and state) per node."""

    def __init__(self, app, n, rc):
        self.app, self.pending, self.calls = app, {}, []
        self.nodes = [101 + 17 * i for i in range(n)]
        self.contexts = {node: Context(run_id=1, node_id=node, state=RecordDict(), run_config=rc,
                                       node_config={"partition-id": i, "num-partitions": n})
                         for i, node in enumerate(self.nodes)}

    def set_run(self, run_id):
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id,
                       group_id=group_id)

    def get_node_ids(self):
        return list(self.nodes)

    def call(self, msg):
        self.calls.append(msg.metadata.message_type)
        # each call's torch RNG (the DataLoader's shuffle) depends on the node, the round and
        # the chunk, not on the order the strategy calls the nodes in: strategies compare
        # like for like (as separate SuperNode processes would, each with its own RNG)
        node = self.nodes.index(msg.metadata.dst_node_id)
        config = msg.content.config_records.get("config", {})
        kind = ("train", "evaluate", "query").index(msg.metadata.message_type.split(".")[0])
        torch.manual_seed(((node * 1009 + int(config.get("server-round", 0))) * 100003
                           + int(config.get("start-step", 0))) * 3 + kind)
        try:
            return self.app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # a failing ClientApp becomes an error reply
            print(f"ClientApp error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)

    def send_and_receive(self, messages, *, timeout=None):
        return [self.call(m) for m in messages]

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{len(self.calls) + len(self.pending):08d}"
            self.pending[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        wanted = sorted(i for i in message_ids if i in self.pending)
        return [self.call(self.pending.pop(i)) for i in wanted]


TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as a SuperLink sets
torch.manual_seed(0)  # the initial model and batch orders: runs compare like for like
random.seed(0)  # Flower's FedAvg samples (and so sums) the nodes in random.sample's order
torch.set_num_threads(1)  # and the same sums on any machine (a thread count changes the bits)
grid = LocalGrid(client_app.app, num_nodes, run_config)
context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
server_app.app(grid, context)
print("SUMMARY " + json.dumps({"task_file": task.__file__, "calls": grid.calls,
                               "history": server_app.HISTORY}))
'''

RUN_CONFIG = {"num-server-rounds": 3, "strategy": "fedavg", "local-epochs": 1, "lr": 0.01,
              "batch-size": 32, "query-client-info": True, "summary-file": ""}
"""The quickstart's run config (3 rounds, 1 local epoch, lr 0.01, batch 32) and ours."""


def build(folder: Path, *, train: str | None = None, query: str | None = None,
          server_main: str | None = None) -> Path:
    """Write the project into ``folder``; the helper ClientApp unless sections are given.

    ``train`` / ``query``: ClientApp sections (None: the version with fedhetero's helpers;
    ``CLIENT_SECTIONS[...]`` for the stock template's). ``server_main``: the ServerApp's
    ``@app.main()`` section (None: the strategy named by the run config).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "task.py").write_text(TASK)
    header = HELPER_HEADER if train is None else CLIENT_SECTIONS["header"]
    client = [header, HELPER_TRAIN if train is None else train,
              CLIENT_SECTIONS["evaluate"], HELPER_QUERY if query is None else query]
    (folder / "client_app.py").write_text("\n".join(client))
    (folder / "server_app.py").write_text(SERVER_HEADER + (server_main or SERVER_MAIN))
    return folder


QUICKSTART_SUPERNODES = 2  # flwr 1.42's default options.num-supernodes for a new app


def run_inprocess(project: Path, run_config: dict, num_nodes: int = QUICKSTART_SUPERNODES,
                  timeout: float = 300) -> dict:
    """Run the project in a fresh interpreter (forked from :mod:`tests.warm_runner`'s, which
    has imported torch and flwr) on the in-process Grid; the runner's summary.

    Raises AssertionError with the output when the run fails.
    """
    runner = project.parent / f"{project.name}-runner.py"
    runner.write_text(RUNNER)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)  # fedhetero, as an installed package would be: after the app
    proc = warm_runner.run_script(runner, [str(project), json.dumps({**RUN_CONFIG, **run_config}),
                                           str(num_nodes)], project, env, timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line is not None, output[-6000:]
    summary = json.loads(line[len("SUMMARY "):])
    summary["output"] = output
    return summary
