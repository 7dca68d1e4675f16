"""The template's ClientApp plus the client contract of FedVeca, DynamicFL, SCAFFOLD,
FedDyn and MOON.

To use them, point ``clientapp`` in pyproject.toml at ``stockapp.client_app_plus:app``.
Everything else is the template's own code (``client_app.py``, unchanged); fedhetero's
``strategies.client`` helpers do the strategy-specific work on the template's own
optimiser (they wrap it, they do not replace it), the replies keep the template's
``train_loss``, and a query handler reports the partition and label histogram.
"""

import torch
import torch.nn.functional as F
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from stockapp.client_app import evaluate as template_evaluate
from stockapp.client_app import train as template_train
from stockapp.task import Net, load_data
from strategies.client import (
    FedDynClient,
    MoonClient,
    ScaffoldClient,
    client_info_reply,
    fedveca_train,
    is_dynamicfl_chunk,
    is_feddyn_message,
    is_fedveca_round,
    is_moon_message,
    is_scaffold_message,
    label_counts,
    sgd_steps,
    train_chunk,
)

app = ClientApp()
app.evaluate()(template_evaluate)


def local_data(context: Context):
    node, run = context.node_config, context.run_config
    return load_data(node["partition-id"], node["num-partitions"], run["data-dir"],
                     run["max-examples"])


def template_optimizer(model: Net, msg: Message):
    """The optimiser the template's ``train`` builds (stockapp.task.train)."""
    return torch.optim.SGD(model.parameters(), lr=msg.content["config"]["lr"])


def batches(x, y, context: Context):
    """The template's batch loop: local-epochs passes over (x, y) in order."""
    size = context.run_config["batch-size"]
    for _ in range(context.run_config["local-epochs"]):
        for start in range(0, len(y), size):
            yield x[start:start + size], y[start:start + size]


def net_representation(model: Net, x):
    """(logits, z) for MOON, z the template Net's last hidden layer (84 features)."""
    z = model.pool(F.relu(model.conv1(x)))
    z = model.pool(F.relu(model.conv2(z))).flatten(1)
    z = F.relu(model.fc2(F.relu(model.fc1(z))))
    return model.fc3(z), z


def drift_corrected(msg: Message, context: Context, model: Net, x, y):
    """SCAFFOLD, FedDyn or MOON: the template's optimiser and batches with the helper's change
    (a step hook on the optimiser, or MOON's loss), run by the one loop of strategies.client."""
    optimizer = template_optimizer(model, msg)
    forward = None
    if is_scaffold_message(msg):  # every step corrected by c - c_i (c_i in context.state)
        helper = ScaffoldClient(msg, context.state)
        helper.wrap(optimizer, model)
    elif is_feddyn_message(msg):  # the regulariser's gradient added before every step
        helper = FedDynClient(msg, context.state)
        helper.wrap(optimizer, model)
    else:  # MOON: l_sup + mu l_con against w^t and this client's previous model
        helper = MoonClient(msg, context.state, model, representation=net_representation)
        forward = helper.forward
    _, train_loss = sgd_steps(model, optimizer, batches(x, y, context), loss_fn=F.cross_entropy,
                              forward=forward)
    return helper.finish(model, {"train_loss": train_loss, "num-examples": len(y)})


@app.train()
def train(msg: Message, context: Context):
    config = msg.content["config"]
    drift = is_scaffold_message(msg) or is_feddyn_message(msg) or is_moon_message(msg)
    if not (is_fedveca_round(config) or is_dynamicfl_chunk(config) or drift):
        return template_train(msg, context)  # FedAvg, FedProx, FedNova: the template's training
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data = local_data(context)  # (x, y) tensors
    partition_id = context.node_config["partition-id"]
    if drift:
        content = drift_corrected(msg, context, model, *data)
    elif is_fedveca_round(config):  # tau steps of the template's SGD, grad F_i(w_k), beta, delta
        content = fedveca_train(model, data, config, partition_id=partition_id,
                                optimizer=template_optimizer(model, msg))
    else:  # one DynamicFL chunk of the template's SGD; its state across chunks in context.state
        content = train_chunk(model, data, config, context.state, partition_id=partition_id,
                              optimizer=template_optimizer(model, msg))
    return Message(content, reply_to=msg)


@app.query()
def query(msg: Message, context: Context):
    """Partition id (reproducible sampling) and label histogram (DynaComm)."""
    _, y = local_data(context)
    return client_info_reply(msg, partition_id=context.node_config["partition-id"],
                             num_examples=len(y), label_counts=label_counts(y, num_classes=10))
