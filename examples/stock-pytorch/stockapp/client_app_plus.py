"""The template's ClientApp plus the client contract of FedVeca and DynamicFL.

To use FedVeca or DynamicFL, point ``clientapp`` in pyproject.toml at
``stockapp.client_app_plus:app``. Everything else is the template's own code
(``client_app.py``, unchanged); fedhetero's ``strategies.client`` helpers do the
strategy-specific work, and a query handler reports the partition and label histogram.
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from stockapp.client_app import evaluate as template_evaluate
from stockapp.client_app import train as template_train
from stockapp.task import Net, load_data
from strategies.client import (
    client_info_reply,
    fedveca_train,
    is_dynamicfl_chunk,
    is_fedveca_round,
    label_counts,
    train_chunk,
)

app = ClientApp()
app.evaluate()(template_evaluate)


def local_data(context: Context):
    node, run = context.node_config, context.run_config
    return load_data(node["partition-id"], node["num-partitions"], run["data-dir"],
                     run["max-examples"])


@app.train()
def train(msg: Message, context: Context):
    config = msg.content["config"]
    if not (is_fedveca_round(config) or is_dynamicfl_chunk(config)):
        return template_train(msg, context)  # FedAvg, FedProx, FedNova: the template's training
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data = local_data(context)  # (x, y) tensors
    partition_id = context.node_config["partition-id"]
    if is_fedveca_round(config):  # tau plain-SGD steps, the local gradient, beta, delta
        content = fedveca_train(model, data, config, partition_id=partition_id)
    else:  # one DynamicFL chunk; momentum across chunks in context.state
        content = train_chunk(model, data, config, context.state, partition_id=partition_id)
    return Message(content, reply_to=msg)


@app.query()
def query(msg: Message, context: Context):
    """Partition id (reproducible sampling) and label histogram (DynaComm)."""
    _, y = local_data(context)
    return client_info_reply(msg, partition_id=context.node_config["partition-id"],
                             num_examples=len(y), label_counts=label_counts(y, num_classes=10))
